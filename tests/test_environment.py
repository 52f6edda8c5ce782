"""A quiet tool's log: TensorFlow's Python INFO lines dropped, its warnings kept; Keras's progress
bar only on a terminal."""

from __future__ import annotations

import subprocess
import sys

import pytest

from retrieval.environment import progress_verbosity

SCRIPT = """
import logging, sys
from retrieval.environment import quiet_tensorflow
quiet_tensorflow(verbose=sys.argv[1] == "verbose")
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
import tensorflow as tf
from absl import logging as absl_logging
tf.get_logger().info("Assets written to: somewhere")
absl_logging.info("Function `endpoint` contains input name(s)")
tf.get_logger().warning("a real tensorflow warning")
logging.getLogger("retrieval.training.run").info("our own progress")
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_a_quiet_tool_drops_tensorflow_s_python_info_lines_and_keeps_its_warnings(verbose: bool) -> None:
    mode = "verbose" if verbose else "quiet"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300, check=True
    )
    err = done.stderr
    assert "a real tensorflow warning" in err and "our own progress" in err
    assert ("Assets written to" in err) == verbose, err
    assert ("Function `endpoint`" in err) == verbose, err


def test_the_progress_bar_is_drawn_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert progress_verbosity(quiet=True) == 0
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert progress_verbosity(quiet=False) == 1
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert progress_verbosity(quiet=False) == 2  # one line per epoch, no carriage returns
