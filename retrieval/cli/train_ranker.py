"""Train a pre-ranking model on a retriever's candidates and measure the reranking.

mitt train-ranker --model runs/beauty-sasrec --index runs/beauty-sasrec-index \\
    --data data/amazon-beauty/Beauty.txt --ranker din --out runs/beauty-din
mitt train-ranker --model runs/ml100k-sa --index runs/ml100k-sa-index \\
    --data data/ml-100k --ranker dstn --negatives retrieved+uniform --out runs/ml100k-dstn \\
    --set options.hidden_units=[64,32] --set positions_per_user=20

Click examples come from the same leave-one-out split the retriever was trained on; negatives are
the retriever's candidates the user did not choose (--negatives retrieved, the default), or
uniform / popularity samples, or a mix ("retrieved+uniform"). The test users' top --candidates
are then reranked: retrieval-only vs reranked NDCG@10 / HR@10, AUC and GAUC are printed as JSON and
written with the ranker artifact to OUT/metrics.json. Every setting is a field of
retrieval.ranking.config.RankerConfig, settable with --set field=value (ranker arguments:
--set options.NAME=JSON).

Settings are applied in order: the defaults, --config FILE (JSON or YAML, whole or partial; a
ranker folder's config.json repeats its run), the flags below, then every --set. Option values,
ranges and the input folders are checked before TensorFlow is loaded, the ranker's name before
any data is read; --print-config prints the resolved configuration as JSON and exits
(docs/configuration.md).

Every ranker reads the retriever's score of each candidate by default: its own part is trained
on the training clicks, then blended with the retrieval score (g * own + w * score + b) on the
validation users' whole retrieved lists, whose clicks neither the retriever nor the ranker
trained on (--set retrieval_fit=clicks or joint for the alternatives; --set
options.retrieval_score=false for the ranker alone; see retrieval.ranking.config.RankerConfig).
DSTN's context is the request's top --set context_size=N retrieved items (default 20).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

# Configuration only (no TensorFlow): training is imported in main, once the configuration is valid.
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
from retrieval.environment import VERBOSE_HELP, progress_verbosity
from retrieval.ranking import ITEM_INITS, RankerConfig
from retrieval.storage import ArtifactError

__all__ = ["main", "parse_args"]

SAME_NAMED = (
    "ranker", "epochs", "negatives", "num_negatives", "candidates", "positions_per_user", "dim", "item_init",
    "batch_size", "seed",
)  # fmt: skip
FLAG_FIELDS = {**{name: name for name in SAME_NAMED}, "lr": "learning_rate"}
"""Flag dest -> RankerConfig field (each flag but ``--lr`` is named as its field); a flag overrides
its field only when given, and an error names it."""

REQUIRED = ("model", "index", "data", "out")
"""Arguments a training needs (not --print-config)."""


def parse_args(
    argv: Sequence[str] | None, prog: str | None = None
) -> tuple[RankerConfig, argparse.Namespace]:
    """The resolved configuration and the parsed arguments; loads no TensorFlow.

    Raises:
        ValueError: a bad config file or ``--set``, or a value outside its choices or range
            (named by the flag, key or file it came from).
    """
    c = RankerConfig()
    p = command_parser(prog, __doc__)
    p.add_argument("--model", type=Path, help="retrieval model folder (mitt train --out)")
    p.add_argument("--index", type=Path, help="its index folder (mitt build-index --out)")
    p.add_argument("--data", help="the interactions the retriever was trained on")
    p.add_argument("--format", choices=["movielens", "s3rec", "table"], help="override format detection")
    p.add_argument("--ranker", help="a ranker of the rankers registry: din, dien, afm, dstn... (required "
                   "unless --config names one)")  # fmt: skip
    p.add_argument("--out", type=Path, help="ranker artifact folder to create")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--epochs", type=int, help=f"default {c.epochs} (early stopping: patience {c.patience})")
    p.add_argument(
        "--negatives",
        help=f"retrieved, uniform, popularity, or several joined by '+' (default {c.negatives})",
    )
    for flag, default, what in (
        ("--num-negatives", c.num_negatives, "negatives per click"),
        ("--candidates", c.candidates, "retrieval depth: negatives pool and reranked list"),
        ("--positions-per-user", c.positions_per_user, "last clicks of each user trained on"),
    ):
        p.add_argument(flag, type=int, help=f"{what} (default {default})")
    p.add_argument("--dim", type=int, help="embedding size (default: the retrieval model's)")
    p.add_argument(
        "--item-init",
        choices=ITEM_INITS,
        help=f"start the item table from the retriever's item embeddings or not (default {c.item_init})",
    )
    p.add_argument("--batch-size", type=int, help=f"default {c.batch_size}")
    p.add_argument("--lr", type=float, help=f"learning rate (default {c.learning_rate})")
    p.add_argument("--seed", type=int, help=f"default {c.seed}")
    add_config_options(p, RankerConfig, set_help="any RankerConfig field, or options.NAME")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = p.parse_args(argv)
    unnamed = args.ranker is None and args.config is None
    require(p, args, REQUIRED, ["--ranker (or --config)"] if unnamed else [])
    return layered(c, args, FLAG_FIELDS), args


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    started = start(parse_args, argv, prog, lambda _, args: flag_inputs(args, "model", "index", "data"))
    if isinstance(started, int):
        return started
    config, args = started
    from retrieval.ranking import check_config, train_ranker_from_dirs  # TensorFlow, from here on

    log_to_stderr()
    try:
        check_config(config)  # the ranker's name and the negatives' sources, before any data is read
        result = train_ranker_from_dirs(
            config,
            args.model,
            args.index,
            args.data,
            args.out,
            data_format=args.format,
            overwrite=args.overwrite,
            verbose=progress_verbosity(args.quiet),
        )
    except (ValueError, FileExistsError, ArtifactError) as e:  # a DataError is a ValueError
        return refuse(e)
    keys = ("ranker", "users", "candidates", "candidate_recall", "retrieval", "reranked", "validation")
    print(json.dumps({"out": str(args.out), **{k: getattr(result, k) for k in keys}}, indent=2))
    return 0
