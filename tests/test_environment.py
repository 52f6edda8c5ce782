"""A quiet tool's log: TensorFlow's Python INFO lines dropped, its warnings kept; Keras's progress
bar only on a terminal; the native engine's TensorFlow on one thread per pool unless the user says."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from retrieval.environment import THREADS_ENV, progress_verbosity

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


THREADS_SCRIPT = """
from pathlib import Path
from retrieval.environment import single_threaded_tensorflow
single_threaded_tensorflow()
import numpy as np
import tensorflow as tf
x = tf.constant(np.ones((512, 512), np.float32))
tf.function(lambda a: tf.reduce_sum(tf.matmul(a, a) + tf.tanh(a)))(x).numpy()  # large enough to split
print(sum((task / "comm").read_text().strip() == "tf_Compute" for task in Path("/proc/self/task").iterdir()))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads by name in /proc")
@pytest.mark.parametrize(("given", "pool"), [(None, 1), ("3", 3)])
def test_single_threaded_tensorflow_runs_one_compute_thread_unless_the_environment_says(
    given: str | None, pool: int
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in THREADS_ENV} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if given is not None:  # the user's setting wins
        env |= dict.fromkeys(THREADS_ENV, given)
    command = [sys.executable, "-c", THREADS_SCRIPT]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True, env=env)
    assert int(done.stdout.split()[-1]) == pool, done.stderr  # TensorFlow's pool has that many threads
