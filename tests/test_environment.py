"""A quiet tool's log: TensorFlow's Python INFO lines dropped, its warnings kept; Keras's progress
bar only on a terminal; the native engine's TensorFlow on one thread per pool unless the user says.

Both are import-time behaviour, so each case runs in a fresh interpreter; one interpreter checks a
log case and a threads case together (quiet with the default pools, verbose with the user's 3):
two TensorFlow imports (~6 s of CPU each) instead of four."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache

import pytest

from retrieval.environment import THREADS_ENV, progress_verbosity

SCRIPT = """
import logging, sys
from pathlib import Path
from retrieval.environment import quiet_tensorflow, single_threaded_tensorflow
quiet_tensorflow(verbose=sys.argv[1] == "verbose")
single_threaded_tensorflow()
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
import numpy as np
import tensorflow as tf
from absl import logging as absl_logging
tf.get_logger().info("Assets written to: somewhere")
absl_logging.info("Function `endpoint` contains input name(s)")
tf.get_logger().warning("a real tensorflow warning")
logging.getLogger("retrieval.training.run").info("our own progress")
x = tf.constant(np.ones((512, 512), np.float32))
tf.function(lambda a: tf.reduce_sum(tf.matmul(a, a) + tf.tanh(a)))(x).numpy()  # large enough to split
tasks = list(Path("/proc/self/task").iterdir()) if Path("/proc/self/task").is_dir() else None
print(-1 if tasks is None else sum((t / "comm").read_text().strip() == "tf_Compute" for t in tasks))
"""
"""Logs as a tool does (``quiet`` or ``verbose``), then runs an op and prints how many threads
TensorFlow's compute pool has (-1 where ``/proc`` does not list them)."""

THREADS_GIVEN = {False: None, True: "3"}
"""A quiet run keeps TensorFlow's pools to the default of :func:`single_threaded_tensorflow`; a
verbose one gets the user's setting of :data:`THREADS_ENV`."""


@cache
def run_script(verbose: bool) -> subprocess.CompletedProcess[str]:
    """:data:`SCRIPT` in a fresh interpreter, ``THREADS_ENV`` set to ``THREADS_GIVEN[verbose]`` (or unset)."""
    env = {k: v for k, v in os.environ.items() if k not in THREADS_ENV}
    given = THREADS_GIVEN[verbose]
    if given is not None:  # the user's setting wins
        env |= dict.fromkeys(THREADS_ENV, given)
    command = [sys.executable, "-c", SCRIPT, "verbose" if verbose else "quiet"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=True, env=env)


@pytest.mark.slow  # a fresh interpreter that imports TensorFlow: 6-7 s each
@pytest.mark.parametrize("verbose", [False, True])
def test_a_quiet_tool_drops_tensorflow_s_python_info_lines_and_keeps_its_warnings(verbose: bool) -> None:
    err = run_script(verbose).stderr
    assert "a real tensorflow warning" in err and "our own progress" in err
    assert ("Assets written to" in err) == verbose, err
    assert ("Function `endpoint`" in err) == verbose, err


def test_the_progress_bar_is_drawn_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert progress_verbosity(quiet=True) == 0
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert progress_verbosity(quiet=False) == 1
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert progress_verbosity(quiet=False) == 2  # one line per epoch, no carriage returns


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads by name in /proc")
@pytest.mark.parametrize(("verbose", "pool"), [(False, 1), (True, 3)])
def test_single_threaded_tensorflow_runs_one_compute_thread_unless_the_environment_says(
    verbose: bool, pool: int
) -> None:
    done = run_script(verbose)
    assert int(done.stdout.split()[-1]) == pool, done.stderr  # TensorFlow's pool has that many threads
