"""Training under tf.distribute: two worker processes on 127.0.0.1, two replicas in one process.

The oracle is a single-device run with the same configuration and global batch (64 of 496
examples, 8 steps per epoch). Each replica returns its share of the global batch's mean loss
(GlobalBatchTask) and draws the negatives the single device draws (the sampler's seed counters
are mirrored and advance in step), so after the all-reduce a step's loss and gradient are the
single device's up to float32 rounding (measured: 2e-7 relative).

What Adam does with that gradient is another matter. The item table's gradient is a
``tf.IndexedSlices`` with one row per occurrence of an item in the batch, and Keras 3's Adam
squares the rows one by one before adding them into its second moment; a batch split over two
replicas arrives as other rows, so the table takes other steps (5% apart after 16 steps) while
the loss stays close. Hence two tolerances:

* ``train.dense_gradients=true`` (rows summed per item before Adam): the two-worker run is the
  single-device run, losses to 1e-5 and weights to 1e-6 (measured: equal to 5e-9).
* the default (Keras' Adam as is): epoch losses within 1e-3 (measured: 2e-5 apart). Faults move
  them much further: replica losses summed instead of shared double the logged loss, other
  negatives or a lost batch shift it by about 1e-2.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import retrieval.training.run
from retrieval.artifacts.model import MANIFEST
from retrieval.config import apply_overrides
from retrieval.training.callbacks import run_folder
from retrieval.training.config import Config, TrainConfig
from retrieval.training.distribute import GlobalBatchTask, is_chief, make_strategy, peak_learning_rate
from retrieval.training.losses.samplers import CandidateSampler
from retrieval.training.losses.task import SampledSoftmaxTask
from tests.helpers import REPO_ROOT, crash_after_round

FLAGS = ["--model", "youtubednn", "--dim", "8", "--max-len", "6", "--epochs", "2"]
FLAGS += ["--batch-size", "64", "--negatives", "5", "--quiet"]
OVERRIDES = ["model.tower=youtubednn", "model.dim=8", "model.max_len=6", "train.epochs=2"]
OVERRIDES += ["train.batch_size=64", "train.num_negatives=5"]
LOSS_RTOL = 1e-3  # default Adam, see the module docstring
EXACT_RTOL = 1e-5  # train.dense_gradients=true
TIMEOUT = 240  # seconds for one run of the tool: 10-25 s on 2 busy cores, past 80 s under a load of 10


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_workers(data: Path, out: Path, scratch: Path, *extra: str, workers: int = 2) -> list[dict[str, Any]]:
    """Runs ``tools/train.py --strategy multi-worker`` as ``workers`` processes on 127.0.0.1, each
    with its own ``TF_CONFIG`` and ``TMPDIR`` = ``scratch``; returns what each printed.

    Fails with every process's last output lines when one fails or they exceed :data:`TIMEOUT`.
    """
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(workers)]}
    command = [sys.executable, str(REPO_ROOT / "tools" / "train.py"), "--data", str(data)]
    command += ["--out", str(out), "--strategy", "multi-worker", *FLAGS, *extra]
    scratch.mkdir(exist_ok=True)
    processes = []
    for index in range(workers):
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
            "TMPDIR": str(scratch),
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        processes.append(
            subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    outputs = []
    try:
        for p in processes:
            stdout, stderr = p.communicate(timeout=TIMEOUT)
            outputs.append((p.returncode, stdout.decode(), stderr.decode()))
    except subprocess.TimeoutExpired:
        outputs.append((None, "", f"timed out after {TIMEOUT} s"))
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    if len(outputs) < workers or any(code != 0 for code, _, _ in outputs):
        report = "\n".join(f"worker {i} exit {c}:\n{err[-3000:]}" for i, (c, _, err) in enumerate(outputs))
        pytest.fail(f"the multi-worker run failed:\n{report}")
    return [json.loads(stdout) for _, stdout, _ in outputs]


def single_config(data: Path, *extra: str) -> Config:
    return apply_overrides(Config(), [f"data.path={data}", *OVERRIDES, *extra])


def single_run(data: Path, out: Path, *extra: str) -> dict[str, Any]:
    retrieval.training.run.train(single_config(data, *extra), out, verbose=0)
    return {
        "metrics": json.loads((out / "metrics.json").read_text()),
        "items": np.load(out / "item_embeddings.npy"),
    }


@pytest.fixture(scope="module")
def single(synthetic_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The single-device reference run, Keras' Adam as is."""
    return single_run(synthetic_csv, tmp_path_factory.mktemp("single") / "m")


@pytest.mark.slow  # two TensorFlow worker processes and a reference run: 18 s here, 32 s loaded
def test_two_workers_train_like_one_device(
    synthetic_csv: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    dense = "train.dense_gradients=true"
    expected = single_run(synthetic_csv, tmp_path_factory.mktemp("single-dense") / "m", dense)
    out, scratch = tmp_path / "model", tmp_path / "scratch"
    chief, worker = run_workers(synthetic_csv, out, scratch, "--set", dense)
    assert chief["out"] == str(out) and worker["out"] is None
    # One artifact, the chief's; the other worker's scratch copies are gone, as are the checkpoints.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "scratch"]
    assert list(scratch.iterdir()) == []
    assert json.loads((out / MANIFEST).read_text())["kind"] == "model" and not run_folder(out).exists()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and expected["metrics"]["replicas"] == 1
    assert metrics["train_examples"] == expected["metrics"]["train_examples"] == 496
    losses = metrics["train_loss_per_epoch"]
    np.testing.assert_allclose(losses, expected["metrics"]["train_loss_per_epoch"], rtol=EXACT_RTOL)
    np.testing.assert_allclose(np.load(out / "item_embeddings.npy"), expected["items"], atol=1e-6)
    assert metrics["test"] == pytest.approx(expected["metrics"]["test"], abs=1e-9)
    # Both workers validated the same weights alike (and so take the same early-stopping decisions).
    assert chief["validation"] == worker["validation"] == pytest.approx(metrics["validation"])


@pytest.mark.slow  # MirroredStrategy in a child process, after the reference run: 9 s, 15 s loaded
def test_two_replicas_in_one_process(synthetic_csv: Path, tmp_path: Path, single: dict) -> None:
    """MirroredStrategy over two logical CPU devices (replicas of 32 examples each), Keras' Adam."""
    out = tmp_path / "model"
    command = [sys.executable, str(REPO_ROOT / "tools" / "train.py"), "--data", str(synthetic_csv)]
    command += ["--out", str(out), "--strategy", "mirrored", "--replicas", "2", *FLAGS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["replicas"] == 2
    expected = single["metrics"]["train_loss_per_epoch"]
    np.testing.assert_allclose(metrics["train_loss_per_epoch"], expected, rtol=LOSS_RTOL)


@pytest.mark.slow  # two TensorFlow worker processes: 13 s here, 20 s loaded
def test_two_workers_resume_a_single_device_run(synthetic_csv: Path, tmp_path: Path, single: dict) -> None:
    """A run interrupted after its first epoch on one device is finished by two workers: both
    restore the chief's checkpoint (weights, optimizer, seed counters) and end where the
    uninterrupted single-device run did."""
    out = tmp_path / "model"
    with crash_after_round(0):
        retrieval.training.run.train(single_config(synthetic_csv), out, verbose=0)
    assert (run_folder(out) / "checkpoint").is_dir() and not out.exists()
    run_workers(synthetic_csv, out, tmp_path / "scratch", "--resume")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs_trained"] == 2 and [h["epoch"] for h in metrics["validation_per_epoch"]] == [1, 2]
    expected = single["metrics"]["train_loss_per_epoch"]
    assert metrics["train_loss_per_epoch"][0] == pytest.approx(expected[0], rel=1e-6)  # the checkpoint's
    np.testing.assert_allclose(metrics["train_loss_per_epoch"], expected, rtol=LOSS_RTOL)
    assert not run_folder(out).exists()


def test_global_batch_task_is_the_task_on_one_replica() -> None:
    """Under the default strategy (one replica) the wrapper's loss and gradient are the task's."""
    table = tf.Variable(np.random.default_rng(0).normal(size=(21, 4)).astype(np.float32))

    def loss_and_grad(task: Any) -> tuple[np.ndarray, np.ndarray]:
        interests = tf.constant(np.random.default_rng(1).normal(size=(6, 2, 4)).astype(np.float32))
        with tf.GradientTape() as tape:
            loss = task(interests, tf.constant([1, 5, 9, 9, 20, 3]), lambda ids: tf.gather(table, ids))
        return loss.numpy(), tape.gradient(loss, table).values.numpy()

    def fresh() -> SampledSoftmaxTask:
        return SampledSoftmaxTask(CandidateSampler.from_counts(np.arange(21), seed=3), 7)

    wrapped = GlobalBatchTask(fresh())
    assert wrapped.num_negatives == 7 and wrapped.variables == wrapped.task.variables
    for a, b in zip(loss_and_grad(fresh()), loss_and_grad(wrapped), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_strategy_arguments_and_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("parameter-server")
    with pytest.raises(ValueError, match="mirrored strategy only"):
        make_strategy("default", replicas=2)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="needs TF_CONFIG"):
        make_strategy("multi-worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        make_strategy("multi-worker")

    def role(task_type: str | None, task_id: int, jobs: dict[str, list[str]]) -> bool:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(jobs), task_type=task_type, task_id=task_id
        )
        return is_chief(SimpleNamespace(cluster_resolver=resolver))  # type: ignore[arg-type]

    workers = {"worker": ["a:1", "b:1"]}
    assert role("worker", 0, workers) and not role("worker", 1, workers)
    assert role("chief", 0, {"chief": ["c:1"], **workers}) and not role(
        "worker", 0, {"chief": ["c:1"], **workers}
    )
    assert is_chief(tf.distribute.get_strategy())


def test_learning_rate_scaling() -> None:
    assert peak_learning_rate(TrainConfig(learning_rate=0.01), 4) == pytest.approx(0.01)
    assert peak_learning_rate(TrainConfig(learning_rate=0.01, lr_scaling="linear"), 4) == pytest.approx(0.04)
    assert peak_learning_rate(TrainConfig(learning_rate=0.01, lr_scaling="sqrt"), 4) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="lr_scaling"):
        peak_learning_rate(TrainConfig(lr_scaling="cubic"), 2)
