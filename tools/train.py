"""Train a two-tower retriever and write its model artifact.

python tools/train.py --data ../shared/data/ml-100k --model sa --epochs 20 --out runs/ml100k-sa
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence

from retrieval.config import Config, DataConfig, ModelConfig, TrainConfig, apply_overrides
from retrieval.train import train
from towers import tower_names


def parse_args(argv: Sequence[str] | None) -> tuple[Config, argparse.Namespace]:
    m, t = ModelConfig(), TrainConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data", required=True, help="interactions: ML-100K/1M folder, S3-Rec .txt, CSV or Parquet"
    )
    p.add_argument("--format", choices=["movielens", "s3rec", "table"], help="override format detection")
    p.add_argument("--out", required=True, help="model artifact folder to create")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--model", default=m.tower, choices=tower_names(), help="user tower (default %(default)s)")
    p.add_argument("--dim", type=int, default=m.dim, help="embedding size (default %(default)s)")
    p.add_argument(
        "--num-interests", type=int, help="K (default: the tower's; 1 for sasrec, bert4rec, youtubednn)"
    )
    p.add_argument("--max-len", type=int, default=m.max_len, help="history length read (default %(default)s)")
    p.add_argument("--epochs", type=int, default=t.epochs, help="default %(default)s")
    p.add_argument("--batch-size", type=int, default=t.batch_size, help="default %(default)s")
    p.add_argument(
        "--lr", type=float, default=t.learning_rate, help="Adam learning rate (default %(default)s)"
    )
    p.add_argument("--negatives", type=int, default=t.num_negatives, help="sampled negatives per batch")
    p.add_argument("--seed", type=int, default=t.seed, help="default %(default)s")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="any other config field"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    config = Config(
        DataConfig(path=args.data, format=args.format),
        dataclasses.replace(
            m, tower=args.model, dim=args.dim, num_interests=args.num_interests, max_len=args.max_len
        ),
        dataclasses.replace(
            t,
            epochs=args.epochs,
            batch_size=args.batch_size,
            learning_rate=args.lr,
            num_negatives=args.negatives,
            seed=args.seed,
        ),
    )
    return apply_overrides(config, args.set), args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config, args = parse_args(argv)
    try:
        metrics = train(config, args.out, overwrite=args.overwrite, verbose=0 if args.quiet else "auto")
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = {k: metrics[k] for k in ("validation", "test", "baseline_popularity_test", "train_seconds")}
    print(json.dumps({"out": args.out, **summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
