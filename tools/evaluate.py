"""Full-ranking evaluation of a trained model on a dataset, printed as JSON.

    python tools/evaluate.py --model runs/ml100k-sa --data ../shared/data/ml-100k \\
        [--index runs/ml100k-sa-index]

Exact (brute-force) search by default; through the FAISS index when --index is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from retrieval.artifacts import ArtifactError
from retrieval.evaluate import evaluate_model_on_data
from retrieval.index_artifact import load_index
from retrieval.model_artifact import load_model


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model artifact folder (tools/train.py --out)")
    p.add_argument("--data", required=True, help="interactions, same formats as tools/train.py")
    p.add_argument("--format", choices=["movielens", "s3rec", "table"], help="override format detection")
    p.add_argument("--index", help="index folder (tools/build_index.py --out); default exact search")
    p.add_argument("--split", choices=["test", "valid"], default="test", help="default %(default)s")
    args = p.parse_args(argv)
    try:
        model = load_model(args.model)
        index = None if args.index is None else load_index(args.index, model.version)[0]
        metrics = evaluate_model_on_data(model, args.data, args.format, args.split, index)
    except (ArtifactError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    search = "exact" if index is None else index.factory
    print(json.dumps({"model": args.model, "split": args.split, "search": search, **metrics}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
