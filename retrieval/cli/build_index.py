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

Settings are applied in order: the defaults (retrieval/artifacts/index_config.py's IndexConfig),
--config FILE (JSON or YAML, whole or partial), the flags below, then every --set (--set
target_recall=0.95, --set milvus.index_type=IVF_FLAT). Every setting is checked against its
choices or range, and the input folders' existence, before FAISS or TensorFlow is loaded;
--print-config prints the resolved configuration as JSON and exits (docs/configuration.md).

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

# Configuration only: FAISS, pandas and TensorFlow are imported in main, once it is valid.
from retrieval.artifacts import (
    AUTO_FACTORY,
    AUTO_TARGET_RECALL,
    BACKENDS,
    IndexConfig,
    resolve_index_config,
)
from retrieval.cli.inputs import flag_inputs
from retrieval.cli.startup import (
    add_config_options,
    command_parser,
    layered,
    log_to_stderr,
    refuse,
    require,
    start,
)
from retrieval.environment import VERBOSE_HELP
from retrieval.storage import ArtifactError

if TYPE_CHECKING:
    import numpy as np

    from index import VectorIndex
    from retrieval.artifacts import ModelArtifact

__all__ = ["main", "parse_args"]

log = logging.getLogger("build_index")

# flag dest -> IndexConfig field; a flag overrides its field only when given, and an error names it.
FLAG_FIELDS = {
    "factory": "factory",
    "search_params": "search_params",
    "backend": "backend",
    "uri": "milvus.uri",
    "collection": "milvus.collection",
    "index_type": "milvus.index_type",
    "index_params": "milvus.index_params",
    "token_env": "milvus.token_env",
    "target_recall": "target_recall",
    "k": "k",
    "num_users": "num_users",
    "train_size": "train_size",
    "max_build_seconds": "max_build_seconds",
    "seed": "seed",
}


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> tuple[IndexConfig, argparse.Namespace]:
    """The resolved configuration and the parsed arguments; loads no FAISS, pandas or TensorFlow.

    Raises:
        ValueError: a bad config file or ``--set``, or a value outside its choices or range
            (named by the flag, key or file it came from).
    """
    c = IndexConfig()
    p = command_parser(prog, __doc__)
    p.add_argument("--model", type=Path, help="model artifact folder (mitt train --out)")
    p.add_argument("--out", type=Path, help="index artifact folder to create")
    p.add_argument(
        "--factory",
        help=f"FAISS factory string (HNSW32, IVF1024,Flat, OPQ16,IVF4096,PQ16) or {AUTO_FACTORY} "
        f"(default {c.factory})",
    )
    p.add_argument(
        "--search-params",
        help="search parameters: FAISS's (nprobe=16, efSearch=128), or Milvus' as JSON ({\"ef\": 128})",
    )
    p.add_argument("--backend", choices=BACKENDS, help=f"where the vectors live (default {c.backend})")
    p.add_argument("--uri", help="milvus: a milvus-lite file (runs/items.db) or a server (http://host:19530)")
    p.add_argument("--collection", help="milvus: the collection to create (default items_<model version>)")
    p.add_argument(
        "--index-type", help=f"milvus: FLAT, HNSW, IVF_FLAT, IVF_PQ... (default {c.milvus.index_type})"
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
        type=float,
        help="tune: the cheapest search parameters (and with --factory auto, index type) reaching "
        f"this recall@k against exact search (default {AUTO_TARGET_RECALL} with --factory {AUTO_FACTORY})",
    )
    p.add_argument("--k", type=int, help=f"recall cut-off for tuning and measuring (default {c.k})")
    p.add_argument("--data", help="interaction data whose users' interest vectors are the tuning queries")
    p.add_argument("--format", help="data format (movielens, s3rec, table); detected from --data by default")
    p.add_argument(
        "--num-users", type=int, help=f"users sampled from --data as queries (default {c.num_users})"
    )
    p.add_argument("--train-size", type=int, help="vectors sampled to train IVF/PQ (default: automatic)")
    p.add_argument(
        "--max-build-seconds", type=float, help="tuning prefers indexes built within this time (e.g. 60)"
    )
    p.add_argument("--seed", type=int, help=f"default {c.seed}")
    p.add_argument("--publish", action="store_true", help="write a new version under --out and swap to it")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    add_config_options(p, IndexConfig, set_help="any IndexConfig field, milvus.FIELD for Milvus'")
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = p.parse_args(argv)
    require(p, args, ["model", "out"])
    config = layered(c, args, FLAG_FIELDS)
    try:
        return resolve_index_config(config), args
    except ValueError as e:  # fields that do not go together: a usage error, as it always was
        p.error(str(e))


def tuning_queries(model: ModelArtifact, config: IndexConfig, args: argparse.Namespace) -> np.ndarray:
    """Real users' interests ``[U, K, d]`` from ``--data``, or sampled item vectors ``[q, d]``."""
    from retrieval.artifacts import item_queries, user_interest_queries

    if args.data:
        queries = user_interest_queries(model, args.data, args.format, config.num_users, config.seed)
        log.info("tuning on %d users' interest vectors from %s", len(queries), args.data)
        return queries
    print(
        "warning: no --data: measuring recall on item vectors instead of real users' interest "
        "vectors; item vectors find themselves first and overstate the recall an approximate "
        "index reaches (pass --data with the interactions the model was trained on)",
        file=sys.stderr,
        flush=True,
    )
    return item_queries(model, config.num_users * model.num_interests, config.seed)


def print_memory(factories: Sequence[str], n: int, d: int) -> None:
    from index import estimate_memory

    for factory in factories:
        try:
            estimate: Any = estimate_memory(factory, n, d)
        except ValueError as e:
            estimate = f"unknown ({e})"
        print(f"memory estimate for {factory} over {n} x {d}: {estimate}", file=sys.stderr, flush=True)


def build(
    model: ModelArtifact, queries: np.ndarray, config: IndexConfig, overwrite: bool
) -> tuple[VectorIndex, Any]:
    """The index ``config`` asks for, and the tuner's record (``None`` when not tuned)."""
    from retrieval.artifacts import (
        build_index_from_model,
        build_milvus_index_from_model,
        tune_index_for_model,
    )

    if config.target_recall is not None:
        result = tune_index_for_model(
            model,
            queries,
            config.k,
            config.target_recall,
            config.factory,
            train_size=config.train_size,
            seed=config.seed,
            max_build_seconds=config.max_build_seconds,
        )
        if not result.reached:
            log.warning(
                "%s reaches recall@%d %.4f at best, short of %.4f",
                result.chosen.factory, config.k, result.chosen.recall, config.target_recall,
            )  # fmt: skip
        return result.index, result.summary()
    if config.backend == "milvus":
        milvus = config.milvus
        assert milvus.uri is not None  # resolve_index_config refuses Milvus without one
        # Milvus names hold letters, digits and underscores only.
        collection = milvus.collection or "items_" + re.sub(r"\W", "_", model.version)
        built = build_milvus_index_from_model(
            model,
            milvus.uri,
            collection,
            index_type=milvus.index_type,
            index_params=milvus.index_params,
            search_params=config.milvus_search_params,
            token_env=milvus.token_env,
            overwrite=overwrite,
        )
        return built, None
    faiss = build_index_from_model(
        model, config.factory, config.search_params, train_size=config.train_size, seed=config.seed
    )
    return faiss, None


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    started = start(parse_args, argv, prog, lambda _, args: flag_inputs(args, "model", "data"))
    if isinstance(started, int):
        return started
    config, args = started
    # Imported here, once TensorFlow's logging is set and never for --help: they load FAISS and
    # pandas, and TensorFlow with the model.
    from index import candidate_factories
    from retrieval.artifacts import load_model, measure_index, publish_index, save_index
    from retrieval.data import DataError

    log_to_stderr()
    try:
        if args.publish and args.overwrite:
            raise ValueError("--publish keeps versions side by side: --overwrite does not apply")
        if not args.publish and args.out.exists() and not args.overwrite:
            raise FileExistsError(f"{args.out} already exists (pass --overwrite to replace it)")
        model = load_model(args.model)
        n, d = len(model.vocab), model.dim
        print_memory(candidate_factories(n, d) if config.factory == AUTO_FACTORY else [config.factory], n, d)
        queries = tuning_queries(model, config, args)
        start_time = time.perf_counter()
        index, tuning = build(model, queries, config, args.overwrite)
        seconds = time.perf_counter() - start_time
        measured = measure_index(index, model, queries, config.k)
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
        return refuse(e)
    summary = {
        "out": str(out),
        "version": version,
        "model_version": model.version,
        **index.describe(),
        "build_seconds": round(seconds, 3),
        f"recall@{config.k}_vs_exact": measured["recall"],
        "measured": measured,
    }
    print(json.dumps(summary))
    return 0
