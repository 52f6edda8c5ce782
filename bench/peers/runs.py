"""Running one model of either side in its own process, and reading its exported vectors back
into the numbers of the report."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.data import REPO
from bench.peers.envs import PEER_ENVS, peer_command, peer_environment
from bench.peers.evaluation import SELECT_BY, align_items, evaluate_vectors, validation_metrics
from bench.peers.ours import ours_config, run_settings
from bench.peers.plan import ModelRun, Settings
from bench.peers.splits import BenchSplit, check_recbole_split


def run_process(
    command: Sequence[str], log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> dict[str, Any]:
    """Runs ``command`` (in ``cwd``) with its output appended to ``log``.

    Returns:
        ``{"returncode", "seconds", "peak_rss_mb"}``: the peak resident memory of that process
        (``wait4``'s ``ru_maxrss``, its own, not this process's).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        process = subprocess.Popen(
            list(command), stdout=out, stderr=subprocess.STDOUT, env=dict(env or os.environ), cwd=cwd
        )
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return {
        "returncode": process.returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # kilobytes on Linux
    }


def epoch_folders(export: Path) -> list[tuple[int, Path]]:
    """The runner's ``epoch_NNN`` folders, by epoch."""
    found = [(int(p.name.split("_")[1]), p) for p in export.glob("epoch_*") if p.is_dir()]
    return sorted(found)


def speed(epochs: Sequence[Mapping[str, Any]], examples: int, events: int) -> dict[str, Any]:
    """Per-epoch training time: the median (robust to the first epoch's tracing and to noise),
    examples/s and training events/s at that median, and the cumulative seconds per epoch."""
    seconds = [float(e["train_seconds"]) for e in epochs]
    median = float(np.median(seconds)) if seconds else float("nan")
    return {
        "epoch_seconds": seconds,
        "median_epoch_seconds": round(median, 3),
        "cumulative_seconds": [round(float(c), 3) for c in np.cumsum(seconds)],
        "train_examples": examples,
        "train_events": events,
        "examples_per_second": round(examples / median, 1) if median > 0 else None,
        "events_per_second": round(events / median, 1) if median > 0 else None,
    }


def summarize(run: ModelRun, split: BenchSplit, export: Path, max_len: int) -> dict[str, Any]:
    """A finished run's numbers, all from our evaluator on ``split``.

    Peers: the validation metrics of every exported epoch, the best epoch by the protocol's
    validation metric (:data:`~bench.peers.evaluation.SELECT_BY`), and its test metrics. Ours:
    the validation metrics our training computed every epoch, and the test metrics of the
    exported (best) weights; for ``loo`` they are checked against those our training reported.
    """
    progress = json.loads((export / "progress.json").read_text())
    item_ids = json.loads((export / "item_ids.json").read_text())
    events = int(sum(len(s) for s in split.train))
    validation, best_epoch, folder = _validation(run, split, export, progress, item_ids)
    table, missing = align_items(item_ids, np.load(folder / "items.npy"), split.items)
    _, histories, targets = split.part("test")
    result: dict[str, Any] = {"run": run.name, **dataclasses.asdict(run)}
    result["hyper_parameters"] = progress.get("hyper_parameters")
    result["versions"] = progress.get("versions")
    result["test"] = evaluate_vectors(
        np.load(folder / "test_users.npy"), table, histories, targets, split.protocol, missing
    )
    result["items_without_vector"] = len(missing)
    result["selected_by"] = SELECT_BY[split.protocol]
    result["validation_curve"] = [round(v[SELECT_BY[split.protocol]], 6) for v in validation]
    result["best_epoch"] = best_epoch
    result["epochs_trained"] = len(progress["epochs"])
    result["stopped_by_time"] = bool(progress.get("stopped_by_time"))
    result["speed"] = speed(progress["epochs"], int(progress["train_examples"]), events)
    if run.side == "ours" and split.protocol == "loo":
        trained = progress["test_from_training"]
        gap = max(abs(trained[k] - result["test"][k]) for k in result["test"])
        result["check_exported_equals_training"] = {"max_difference": gap, "equal": gap < 1e-4}
    if run.side == "recbole":
        result["split_check"] = check_recbole_split(split, progress["split_check"], max_len)
    return result


def _validation(
    run: ModelRun, split: BenchSplit, export: Path, progress: Mapping[str, Any], item_ids: Sequence[str]
) -> tuple[list[dict[str, float]], int, Path]:
    """``(validation metrics per epoch, best epoch, folder of its vectors)`` of a finished run."""
    if run.side == "ours":
        validation = [e["validation"] for e in progress["epochs"]]
        return validation, int(progress["best_epoch"] or len(validation)), export / "final"
    validation = []
    for _, folder in epoch_folders(export):
        table, missing = align_items(item_ids, np.load(folder / "items.npy"), split.items)
        validation.append(validation_metrics(np.load(folder / "valid_users.npy"), table, split, missing))
    best_epoch = 1 + int(np.argmax([v[SELECT_BY[split.protocol]] for v in validation]))
    return validation, best_epoch, export / f"epoch_{best_epoch:03d}"


def prune_epochs(export: Path, keep: int) -> None:
    """Deletes the exported vectors of every epoch but ``keep`` (they are summarised)."""
    for epoch, folder in epoch_folders(export):
        if epoch != keep:
            shutil.rmtree(folder)


def execute(
    run: ModelRun,
    split: BenchSplit,
    split_dir: Path,
    run_dir: Path,
    data: str,
    s: Settings,
    env: dict[str, Any],
    root: Path | None = None,
) -> dict[str, Any]:
    """Runs one model (or reads back its finished result) and returns its summary.

    Args:
        env: the peer's install (:func:`~bench.peers.envs.ensure_env`; its ``python``).
        root: the data root our presets are looked up under (default: the benchmarks').
    """
    s = run_settings(run, s, root)
    # Ours is also identified by its full training configuration: a preset edited since the
    # run changes it without changing the settings.
    config = ours_config(run, data, s, root) if run.side == "ours" else None
    previous = read_back(run_dir, s, config)
    if previous is not None:
        print(f"--- {run.name} ({run.protocol}): done before, read back", flush=True)
        return previous
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    export = run_dir / "export"
    print(f"--- {run.name} ({run.protocol})", flush=True)
    process = launch(run, run_dir, split_dir, s, config, env)
    if process["returncode"] != 0:
        raise RuntimeError(f"{run.name} failed (exit {process['returncode']}): see {run_dir / 'log.txt'}")
    result = summarize(run, split, export, s.max_len)
    result["process"] = process
    result["settings"] = dataclasses.asdict(s)
    result["config"] = config
    if run.side != "ours":
        prune_epochs(export, result["best_epoch"])
    (run_dir / "result.json").write_text(json.dumps(result, indent=2))
    t = result["test"]
    shown = {k: round(v, 4) for k, v in t.items() if k in ("hr@10", "ndcg@10", "recall@50", "hitrate@50")}
    print(
        f"    {shown}, {result['speed']['median_epoch_seconds']} s/epoch, peak {process['peak_rss_mb']} MB",
        flush=True,
    )
    return result


def read_back(run_dir: Path, s: Settings, config: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's ``result.json`` when it was made with the same settings and (ours) configuration."""
    done = run_dir / "result.json"
    if not done.is_file():
        return None
    previous = json.loads(done.read_text())
    same = [previous.get("settings"), previous.get("config")] == json.loads(
        json.dumps([dataclasses.asdict(s), config])
    )
    return dict(previous) if same else None


def launch(
    run: ModelRun,
    run_dir: Path,
    split_dir: Path,
    s: Settings,
    config: dict[str, Any] | None,
    env: Mapping[str, Any],
) -> dict[str, Any]:
    """Trains ``run`` in a process of its own (:func:`run_process`), its log in ``run_dir``.

    Ours: ``python -m bench.peers --ours-worker SPEC`` from the repository root. A peer: its
    runner with its venv's Python, in the run folder (RecBole writes its TensorBoard logs into
    the working directory).
    """
    log = run_dir / "log.txt"
    if run.side == "ours":
        spec = {"config": config, "out": str(run_dir), "protocol": run.protocol, "seed": s.seed}
        (run_dir / "spec.json").write_text(json.dumps(spec, indent=2))
        command = [sys.executable, "-m", "bench.peers", "--ours-worker", str(run_dir / "spec.json")]
        return run_process(command, log, os.environ, REPO)
    command = peer_command(run, env["python"], split_dir, run_dir / "export", s)
    return run_process(command, log, peer_environment(PEER_ENVS[run.side]), run_dir)
