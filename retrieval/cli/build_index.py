"""Build an index over a trained model's item embeddings and write its index artifact.

    mitt build-index --model runs/ml100k-sa --out runs/ml100k-sa-index
    mitt build-index --model runs/big --out runs/big-ivf --factory IVF4096,Flat \\
        --search-params nprobe=16
    # the cheapest index (type and search parameters) reaching recall@50 >= 0.99 against exact
    # search, measured on real users' interest vectors:
    mitt build-index --model runs/big --out runs/big-index --factory auto \\
        --target-recall 0.99 --k 50 --data data/ml-100k
    # re-index without downtime: ROOT/current is swapped atomically to the new version
    mitt build-index --model runs/big --out runs/big-index-root --publish --factory auto
    # into Milvus (a milvus-lite file, or a server whose token is in $MILVUS_TOKEN):
    mitt build-index --model runs/big --out runs/big-milvus --backend milvus \\
        --uri http://milvus.internal:19530 --index-type HNSW --index-params '{"M": 32}' \\
        --search-params '{"ef": 128}' --token-env MILVUS_TOKEN

The memory estimate is printed before building; the chosen setting and its measured recall@k
and latency go into the manifest. Prints one JSON line: the artifact, its shape, build time,
and the measurements.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retrieval.cli.inputs import flag_inputs, missing_inputs
from retrieval.config import SEEDS, Range, ranged
from retrieval.environment import VERBOSE_HELP, quiet_tensorflow
from retrieval.storage import ArtifactError

if TYPE_CHECKING:
    import numpy as np

    from index import VectorIndex
    from retrieval.artifacts import ModelArtifact

__all__ = ["main", "parse_args"]

log = logging.getLogger("build_index")


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, type=Path, help="model artifact folder (mitt train --out)")
    p.add_argument("--out", required=True, type=Path, help="index artifact folder to create")
    p.add_argument(
        "--factory",
        default="Flat",
        help="FAISS factory string (HNSW32, IVF1024,Flat, OPQ16,IVF4096,PQ16) or auto",
    )
    p.add_argument(
        "--search-params",
        default="",
        help="search parameters: FAISS's (nprobe=16, efSearch=128), or Milvus' as JSON ({\"ef\": 128})",
    )
    p.add_argument(
        "--backend",
        choices=("faiss", "milvus"),
        default="faiss",
        help="where the vectors live (default faiss)",
    )
    p.add_argument("--uri", help="milvus: a milvus-lite file (runs/items.db) or a server (http://host:19530)")
    p.add_argument("--collection", help="milvus: the collection to create (default items_<model version>)")
    p.add_argument(
        "--index-type", default="HNSW", help="milvus: FLAT, HNSW, IVF_FLAT, IVF_PQ... (default HNSW)"
    )
    p.add_argument(
        "--index-params", help='milvus: build parameters as JSON, e.g. {"M": 32, "efConstruction": 200}'
    )
    p.add_argument(
        "--token-env",
        metavar="VAR",
        help="milvus: the environment variable holding the server's token (default MILVUS_TOKEN); "
        "the artifact records its name, never the token",
    )
    p.add_argument(
        "--target-recall",
        type=ranged(float, Range(0, 1, low_open=True)),
        help="tune: the cheapest search parameters (and with --factory auto, index type) reaching "
        "this recall@k against exact search (default 0.99 with --factory auto)",
    )
    p.add_argument(
        "--k", type=ranged(int, Range(1)), default=50, help="recall cut-off for tuning and measuring"
    )
    p.add_argument("--data", help="interaction data whose users' interest vectors are the tuning queries")
    p.add_argument("--format", help="data format (movielens, s3rec, table); detected from --data by default")
    p.add_argument(
        "--num-users", type=ranged(int, Range(1)), default=1000, help="users sampled from --data as queries"
    )
    p.add_argument(
        "--train-size",
        type=ranged(int, Range(1)),
        help="vectors sampled to train IVF/PQ (default: automatic)",
    )
    p.add_argument(
        "--max-build-seconds",
        type=ranged(float, Range(0, low_open=True)),
        help="tuning prefers indexes built within this time (e.g. 60)",
    )
    p.add_argument("--seed", type=ranged(int, SEEDS), default=0)
    p.add_argument("--publish", action="store_true", help="write a new version under --out and swap to it")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = p.parse_args(argv)
    if args.backend == "milvus":
        if not args.uri:
            p.error("--backend milvus needs --uri")
        if args.factory != "Flat" or args.target_recall is not None:
            p.error("--factory and --target-recall tune FAISS indexes; for Milvus give --index-type")
        args.index_params = _json_object(p, "--index-params", args.index_params)
        args.search_params = _json_object(p, "--search-params", args.search_params)
    elif args.uri or args.collection or args.index_params or args.token_env:
        p.error("--uri, --collection, --index-params and --token-env are for --backend milvus")
    return args


def _json_object(p: argparse.ArgumentParser, flag: str, text: str | None) -> dict[str, Any]:
    """``text`` parsed as a JSON object (empty: ``{}``); a parser error otherwise."""
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        p.error(f"{flag} must be a JSON object: {e}")
    if not isinstance(value, dict):
        p.error(f"{flag} must be a JSON object, got {text}")
    return value


def tuning_queries(model: ModelArtifact, args: argparse.Namespace) -> np.ndarray:
    """Real users' interests ``[U, K, d]`` from ``--data``, or sampled item vectors ``[q, d]``."""
    from retrieval.artifacts import item_queries, user_interest_queries

    if args.data:
        queries = user_interest_queries(model, args.data, args.format, args.num_users, args.seed)
        log.info("tuning on %d users' interest vectors from %s", len(queries), args.data)
        return queries
    print(
        "warning: no --data: measuring recall on item vectors instead of real users' interest "
        "vectors; item vectors find themselves first and overstate the recall an approximate "
        "index reaches (pass --data with the interactions the model was trained on)",
        file=sys.stderr,
        flush=True,
    )
    return item_queries(model, args.num_users * model.num_interests, args.seed)


def print_memory(factories: Sequence[str], n: int, d: int) -> None:
    from index import estimate_memory

    for factory in factories:
        try:
            estimate: Any = estimate_memory(factory, n, d)
        except ValueError as e:
            estimate = f"unknown ({e})"
        print(f"memory estimate for {factory} over {n} x {d}: {estimate}", file=sys.stderr, flush=True)


def build(model: ModelArtifact, queries: np.ndarray, args: argparse.Namespace) -> tuple[VectorIndex, Any]:
    """The index the arguments ask for, and the tuner's record (``None`` when not tuned)."""
    from retrieval.artifacts import (
        build_index_from_model,
        build_milvus_index_from_model,
        tune_index_for_model,
    )

    if args.target_recall is not None:
        result = tune_index_for_model(
            model,
            queries,
            args.k,
            args.target_recall,
            args.factory,
            train_size=args.train_size,
            seed=args.seed,
            max_build_seconds=args.max_build_seconds,
        )
        if not result.reached:
            log.warning(
                "%s reaches recall@%d %.4f at best, short of %.4f",
                result.chosen.factory, args.k, result.chosen.recall, args.target_recall,
            )  # fmt: skip
        return result.index, result.summary()
    if args.backend == "milvus":
        # Milvus names hold letters, digits and underscores only.
        collection = args.collection or "items_" + re.sub(r"\W", "_", model.version)
        milvus = build_milvus_index_from_model(
            model,
            args.uri,
            collection,
            index_type=args.index_type,
            index_params=args.index_params,
            search_params=args.search_params,
            token_env=args.token_env,
            overwrite=args.overwrite,
        )
        return milvus, None
    faiss = build_index_from_model(
        model, args.factory, args.search_params, train_size=args.train_size, seed=args.seed
    )
    return faiss, None


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    if args.factory == "auto" and args.target_recall is None:
        args.target_recall = 0.99
    if missing_inputs(flag_inputs(args, "model", "data")):
        return 2
    quiet_tensorflow(args.verbose)
    # Imported here, once TensorFlow's logging is set and never for --help: they load FAISS and
    # pandas, and TensorFlow with the model.
    from index import candidate_factories
    from retrieval.artifacts import load_model, measure_index, publish_index, save_index
    from retrieval.data import DataError

    # Configured after the imports: FAISS's loader logs at INFO every build of it that it tries.
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.publish and args.overwrite:
            raise ValueError("--publish keeps versions side by side: --overwrite does not apply")
        if not args.publish and args.out.exists() and not args.overwrite:
            raise FileExistsError(f"{args.out} already exists (pass --overwrite to replace it)")
        model = load_model(args.model)
        n, d = len(model.vocab), model.dim
        print_memory(candidate_factories(n, d) if args.factory == "auto" else [args.factory], n, d)
        queries = tuning_queries(model, args)
        start = time.perf_counter()
        index, tuning = build(model, queries, args)
        seconds = time.perf_counter() - start
        measured = measure_index(index, model, queries, args.k)
        measured["query_source"] = "users" if args.data else "items"
        if args.publish:
            out = publish_index(index, args.out, model, measured=measured, tuning=tuning)
            version = json.loads((out / "manifest.json").read_text())["version"]
        else:
            out = args.out
            version = save_index(index, out, model, args.overwrite, measured=measured, tuning=tuning)[
                "version"
            ]
    except (ArtifactError, DataError, ValueError, FileExistsError, RuntimeError) as e:  # no pymilvus: Runtime
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = {
        "out": str(out),
        "version": version,
        "model_version": model.version,
        **index.describe(),
        "build_seconds": round(seconds, 3),
        f"recall@{args.k}_vs_exact": measured["recall"],
        "measured": measured,
    }
    print(json.dumps(summary))
    return 0
