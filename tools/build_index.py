"""Build a FAISS index over a trained model's item embeddings and write its index artifact.

    python tools/build_index.py --model runs/ml100k-sa --out runs/ml100k-sa-index
    python tools/build_index.py --model runs/big --out runs/big-hnsw --factory HNSW32 \\
        --search-params efSearch=128

Prints one JSON line: the artifact, its shape, build time and recall@10 against exact search.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from retrieval.artifacts import ArtifactError
from retrieval.index_artifact import build_index_from_model, recall_against_exact, save_index
from retrieval.model_artifact import load_model

RECALL_K = 10


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=Path, help="model artifact folder (tools/train.py --out)")
    p.add_argument("--out", required=True, type=Path, help="index artifact folder to create")
    p.add_argument("--factory", default="Flat", help="FAISS factory string, e.g. HNSW32, IVF1024,Flat")
    p.add_argument(
        "--search-params", default="", help="FAISS search parameters, e.g. nprobe=16, efSearch=128"
    )
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        model = load_model(args.model)
        start = time.perf_counter()
        index = build_index_from_model(model, args.factory, args.search_params)
        build_seconds = time.perf_counter() - start
        manifest = save_index(index, args.out, model, overwrite=args.overwrite)
    except (ArtifactError, ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = {
        "out": str(args.out),
        "version": manifest["version"],
        "model_version": manifest["model_version"],
        **index.describe(),
        "build_seconds": round(build_seconds, 3),
        f"recall@{RECALL_K}_vs_exact": round(recall_against_exact(index, model, RECALL_K), 4),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
