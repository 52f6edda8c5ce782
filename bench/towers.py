"""Every user tower, and every fusion mode of the sequence towers, on one dataset: a results table.

    python -m bench.towers --data ../shared/data/amazon-beauty/Beauty.txt --out runs/bench-towers

Leave-one-out, full ranking over all items with the user's history excluded (the protocol of
``tools/train.py``). Each run is a model artifact under ``--out``; runs whose artifact already
exists are read back instead of retrained, and an interrupted run continues from its last
epoch's checkpoint, so an interrupted benchmark resumes where it stopped. Writes
``results.json`` and ``results.md`` (a Markdown table) into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from retrieval.callbacks import run_folder
from retrieval.config import Config, DataConfig, ModelConfig, TrainConfig, apply_overrides
from retrieval.train import train
from towers import tower_names
from towers.side import FUSIONS

FUSION_TOWERS = ("sasrec",)


def runs(towers: Sequence[str], fusions: Sequence[str], side_features: str) -> list[tuple[str, str]]:
    """(tower, fusion) pairs in the given tower order: each tower without side information,
    followed by its fusion modes when it is one of :data:`FUSION_TOWERS`."""
    pairs = []
    for t in towers:
        pairs.append((t, "none"))
        if side_features and t in FUSION_TOWERS:
            pairs += [(t, f) for f in fusions if f != "none"]
    return pairs


def run_one(config: Config, out: Path) -> dict[str, Any]:
    """Trains (or reads back, or resumes from its last epoch) one run's metrics."""
    if (out / "metrics.json").is_file():
        return json.loads((out / "metrics.json").read_text())
    return train(config, out, verbose=2, resume=run_folder(out).is_dir())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="dataset (any format tools/train.py reads)")
    p.add_argument("--out", type=Path, default=Path("runs/bench-towers"), help="default %(default)s")
    p.add_argument("--towers", nargs="+", default=tower_names(), help="default: every registered tower")
    p.add_argument("--fusions", nargs="+", default=list(FUSIONS), help="fusion modes of the sequence towers")
    p.add_argument("--side-features", default="attributes", help="side features for the fusion runs")
    p.add_argument("--epochs", type=int, default=20, help="default %(default)s")
    p.add_argument("--set", action="append", default=[], help="config override for every run (a.b=c)")
    args = p.parse_args(argv)

    base = apply_overrides(
        Config(DataConfig(path=args.data), ModelConfig(), TrainConfig(epochs=args.epochs)), args.set
    )
    rows = []
    for tower, fusion in runs(args.towers, args.fusions, args.side_features):
        side = args.side_features if fusion != "none" else ""
        model = dataclasses.replace(base.model, tower=tower, fusion=fusion, side_features=side)
        name = f"{tower}-{fusion}"
        print(f"\n=== {name} ===", flush=True)
        metrics = run_one(dataclasses.replace(base, model=model), args.out / name)
        rows.append({"tower": tower, "fusion": fusion, **{k: metrics[k] for k in ("test", "train_seconds")}})
        rows[-1]["objective"] = metrics.get("objective")
        (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    popularity = metrics["baseline_popularity_test"] if rows else {}
    lines = [
        f"Data: `{args.data}`, {args.epochs} epochs, {datetime.now(UTC):%Y-%m-%d}; command: "
        f"`python -m bench.towers {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        "| tower | fusion | objective | HR@10 | NDCG@10 | HR@50 | NDCG@50 | train s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if popularity:
        lines.append(
            f"| most popular | – | – | {popularity['hr@10']:.4f} | {popularity['ndcg@10']:.4f} | "
            f"{popularity['hr@50']:.4f} | {popularity['ndcg@50']:.4f} | – |"
        )
    for r in rows:
        t = r["test"]
        lines.append(
            f"| {r['tower']} | {r['fusion']} | {r['objective']} | {t['hr@10']:.4f} | {t['ndcg@10']:.4f} | "
            f"{t['hr@50']:.4f} | {t['ndcg@50']:.4f} | {r['train_seconds']:.0f} |"
        )
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
