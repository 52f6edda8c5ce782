r"""Train a two-tower retriever and write its model artifact.

mitt train --data data/ml-100k --model sa --out runs/ml100k-sa   # until validation stops improving
mitt train --data mine.csv --preset sasrec --out runs/mine-sasrec
mitt train --preset beauty-sasrec --data-root /data --out runs/beauty-sasrec --loss gbce
mitt train --config runs/beauty-sasrec/config.json --out runs/beauty-sasrec-again
mitt train --preset ml100k-sa --max-steps 2000 --print-config > ml100k-sa.json
mitt train --data runs/big-prepared --out runs/big-sa     # a mitt prepare folder
TF_CONFIG='{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}' \
    mitt train --data runs/big-prepared --out /shared/runs/big-sa --strategy multi-worker

Settings are applied in order: the defaults (retrieval/training/config.py), --preset (without
one, the tower's own: --preset sasrec for --model sasrec), --config
FILE (JSON or YAML, whole or partial; a model folder's config.json repeats its run exactly), the
flags below, then every --set. A preset's dataset is looked up under --data-root (default
$MITT_DATA) unless a later layer sets data.path. Every setting is checked against its choices or
range, and the data's existence, before TensorFlow is loaded or any data read; --print-config
prints the resolved configuration as JSON and exits (docs/configuration.md). An interrupted run
continues with the same command plus --resume.

--strategy multi-worker runs one process per host, each with its own TF_CONFIG (the cluster's
workers and this one's index) and otherwise the same command; worker 0 (or the "chief" task)
writes --out. --batch-size is the global batch, shared by the replicas.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

# Configuration only (no TensorFlow, no data libraries): the training itself is imported in
# main, once the configuration is known to be valid.
from retrieval.cli.inputs import Input
from retrieval.cli.startup import add_config_options, command_parser, layered, log_to_stderr, refuse, start
from retrieval.config import Range, apply_overrides, ranged
from retrieval.data import DATA_ROOT_ENV, TIMESTAMP_UNITS, parse_columns
from retrieval.environment import VERBOSE_HELP, progress_verbosity
from retrieval.storage import ArtifactError
from retrieval.training import (
    DATA_FORMATS,
    LOSSES,
    LR_SCALINGS,
    STRATEGIES,
    TOWERS,
    TRAINING_PROTOCOLS,
    Config,
    ModelConfig,
    TrainConfig,
    get_preset,
    preset_for,
    preset_names,
)

__all__ = ["main", "parse_args"]

# flag dest -> config field; a flag overrides its field only when given, and an error names it.
FLAG_FIELDS = {
    "data": "data.path",
    "format": "data.format",
    "timestamp_unit": "data.timestamp_unit",
    "protocol": "data.protocol",
    "model": "model.tower",
    "dim": "model.dim",
    "num_interests": "model.num_interests",
    "max_len": "model.max_len",
    "max_steps": "train.max_steps",
    "epochs": "train.epochs",
    "batch_size": "train.batch_size",
    "lr": "train.learning_rate",
    "loss": "train.loss",
    "negatives": "train.num_negatives",
    "seed": "train.seed",
    "lr_scaling": "train.lr_scaling",
}


def _layered(config: Config, args: argparse.Namespace) -> Config:
    """``config`` under the layers after the preset: the --config file, --columns, the flags, --set."""
    columns = None if args.columns is None else {"data": {"columns": parse_columns(args.columns)}}
    return layered(config, args, FLAG_FIELDS, columns)


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> tuple[Config, argparse.Namespace]:
    """The resolved configuration and the parsed arguments; loads no TensorFlow and reads no data.

    Raises:
        ValueError: an unknown preset, a bad config file or ``--set``, a value outside its
            choices or range (named by the flag, key or file it came from), no data given, or
            (a preset's dataset) no data root.
    """
    m, t = ModelConfig(), TrainConfig()
    p = command_parser(prog, __doc__)
    p.add_argument(
        "--data",
        help="interactions: ML-100K/1M folder, S3-Rec or SASRec .txt, CSV/TSV/Parquet, RecBole .inter",
    )
    p.add_argument(
        "--columns",
        metavar="NAME=COLUMN,...",
        help="the table's column names for ours, e.g. user=uid,item=product_id,timestamp=ts,rating=stars "
        "(replaces data.columns)",
    )
    p.add_argument(
        "--timestamp-unit",
        choices=TIMESTAMP_UNITS,
        help="how the table's timestamps are written: Unix seconds (default), milliseconds, ISO-8601",
    )
    p.add_argument(
        "--format",
        choices=DATA_FORMATS,
        help="override format detection (prepared: a mitt prepare folder, streamed)",
    )
    p.add_argument(
        "--protocol",
        choices=TRAINING_PROTOCOLS,
        help="split: leave-one-out (default), leave-one-out trained on the validation events too "
        "(loo-refit: no validation, a fixed budget: --max-steps a loo run's best_step) or ComiRec's "
        "8:1:1 users with 80/20 history/targets",
    )
    p.add_argument("--out", help="model artifact folder to create (required unless --print-config)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace --out (and an interrupted run) if it exists"
    )
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in OUT.partial")
    p.add_argument("--preset", help=f"named hyper-parameters (and dataset): {', '.join(preset_names())}")
    p.add_argument(
        "--data-root",
        type=Path,
        metavar="DIR",
        help=f"where a preset's dataset is (default: ${DATA_ROOT_ENV})",
    )
    p.add_argument("--model", choices=TOWERS, help=f"user tower (default {m.tower})")
    p.add_argument("--dim", type=int, help=f"embedding size (default {m.dim})")
    p.add_argument(
        "--num-interests", type=int, help="K (default: the tower's; 1 for sasrec, bert4rec, youtubednn)"
    )
    p.add_argument("--max-len", type=int, help=f"history length read (default {m.max_len})")
    p.add_argument(
        "--max-steps",
        type=int,
        help=f"optimizer steps at most (default {t.max_steps}; validation every {t.eval_every_steps}, "
        f"stopping after {t.patience} without a better NDCG@10)",
    )
    p.add_argument("--epochs", type=int, help="count the budget in epochs instead (a fixed run, the old way)")
    p.add_argument("--batch-size", type=int, help=f"default {t.batch_size}")
    p.add_argument("--lr", type=float, help=f"peak learning rate (default {t.learning_rate})")
    p.add_argument("--loss", choices=LOSSES, help=f"training loss (default {t.loss})")
    p.add_argument("--negatives", type=int, help=f"sampled negatives per batch (default {t.num_negatives})")
    p.add_argument("--seed", type=int, help=f"default {t.seed}")
    p.add_argument("--tensorboard", type=Path, metavar="DIR", help="write TensorBoard logs to DIR")
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="default",
        help="tf.distribute: one device (default), the replicas of this machine (mirrored), "
        "or one process per host configured by TF_CONFIG (multi-worker)",
    )
    p.add_argument(
        "--replicas",
        type=ranged(int, Range(1)),
        help="mirrored: replicas on this machine (default: every GPU; without GPUs, this many logical "
        "CPU devices, default 1)",
    )
    p.add_argument(
        "--lr-scaling",
        choices=LR_SCALINGS,
        help="multiply the learning rate by the replicas (linear) or their square root (default none)",
    )
    add_config_options(
        p,
        Config,
        file_help="settings from a JSON or YAML file (after --preset, before the flags and --set)",
        set_metavar="SECTION.FIELD=VALUE",
        set_help="any other config field",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = p.parse_args(argv)
    if args.preset:
        preset = get_preset(args.preset)
    else:  # the tower's own preset, for the tower the other layers name (the file is read twice)
        preset = get_preset(preset_for(None, _layered(Config(), args).model.tower))
    config = _layered(apply_overrides(Config(), preset.overrides), args)
    if preset.dataset and not config.data.path:  # unless a later layer named data
        config = apply_overrides(config, [f"data.path={preset.dataset_path(args.data_root)}"])
    if args.replicas is not None and args.strategy != "mirrored":
        raise ValueError("--replicas is for --strategy mirrored")
    if not args.print_config:
        if not config.data.path:
            raise ValueError("no data: give --data (or a --preset, which names its dataset, or a --config)")
        if not args.out:
            raise ValueError("no --out: give the model artifact folder to create")
    return config, args


def _inputs(config: Config, args: argparse.Namespace) -> Mapping[str, Input]:
    """The data, named as given: ``--data``, or ``data.path`` (a --set, a file, a preset)."""
    return {"--data" if args.data == config.data.path else "data.path": config.data.path}


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    started = start(parse_args, argv, prog, _inputs)
    if isinstance(started, int):
        return started
    config, args = started
    from retrieval.training import is_chief, make_strategy, train  # TensorFlow, from here on

    log_to_stderr()
    try:
        # The process's first TensorFlow op: a multi-worker strategy must precede all others.
        strategy = make_strategy(args.strategy, args.replicas)
        result = train(
            config,
            args.out,
            overwrite=args.overwrite,
            verbose=progress_verbosity(args.quiet),
            resume=args.resume,
            tensorboard=args.tensorboard,
            strategy=strategy,
        )
    except (ValueError, FileExistsError, ArtifactError) as e:
        return refuse(e)
    keys = ("validation", "test", "baseline_popularity_test", "train_seconds", "steps_trained", "best_step")
    out = args.out if is_chief(strategy) else None  # other workers write nothing
    print(json.dumps({"out": out, **{k: getattr(result, k) for k in keys}}, indent=2))
    return 0
