"""What both peer runners share: their common flags and the epoch loop (standard library only:
it runs in the peers' venvs, imported by the runner scripts beside it)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def runner_parser(description: str | None, models: Sequence[str]) -> argparse.ArgumentParser:
    """The flags ``python -m bench.peers`` gives every runner: the model, the split, the output
    folder, the budget and sizes shared with our side, the seed and the time limit."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=models)
    p.add_argument("--split", type=Path, required=True, help="split.json written by python -m bench.peers")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--max-len", type=int, default=50)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--max-minutes", type=float, default=0.0, help="stop after the epoch passing this (0 = none)"
    )
    return p


def train_epochs(
    out: Path,
    progress: dict[str, Any],
    epochs: int,
    max_minutes: float,
    train: Callable[[int], float],
    export: Callable[[Path], None],
) -> None:
    """Trains epoch by epoch, exporting after each, with ``progress.json`` rewritten every time.

    Args:
        out: the run folder; epoch ``n`` exports into ``out/epoch_<nnn>/``.
        progress: what ``progress.json`` says; each epoch appends
            ``{"epoch", "train_seconds", "loss"}`` to its ``"epochs"`` list, and the end sets
            ``"done"`` (and ``"stopped_by_time"`` when ``max_minutes`` cut the run).
        epochs: the most epochs to train.
        max_minutes: stop after the epoch whose training time passes this total (0 = no limit).
        train: trains epoch ``n`` (from 1) and returns its loss; only this call is timed.
        export: writes the vectors the benchmark evaluates into the epoch's folder.
    """
    total = 0.0
    for epoch in range(1, epochs + 1):
        started = time.perf_counter()
        loss = float(train(epoch))
        seconds = time.perf_counter() - started
        total += seconds
        folder = out / f"epoch_{epoch:03d}"
        folder.mkdir(exist_ok=True)
        export(folder)
        progress["epochs"].append({"epoch": epoch, "train_seconds": round(seconds, 3), "loss": loss})
        (out / "progress.json").write_text(json.dumps(progress, indent=2))
        print(f"epoch {epoch}: {seconds:.1f} s, loss {loss:.4f}", flush=True)
        if max_minutes and total > 60 * max_minutes:
            progress["stopped_by_time"] = True
            break
    progress["done"] = True
    (out / "progress.json").write_text(json.dumps(progress, indent=2))
