"""The command line of ``python -m bench.robustness``: ``--fuzz N`` (the default), ``--soak SECONDS``,
``--deploys`` or ``--group``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import bench.robustness
from bench.data import REPO, add_data_root_argument
from bench.robustness.abuse import abuse_main
from bench.robustness.calls import FUZZ_MAX_MESSAGE_BYTES
from bench.robustness.deploys import deploys_main
from bench.robustness.fuzz import fuzz_main
from bench.robustness.soak import soak_main
from bench.robustness.workers import group_main
from retrieval.serving import ENGINES

DEFAULT_OUT = REPO / "runs" / "bench-robustness"


def parser() -> argparse.ArgumentParser:
    """The command line's options: fuzzing, and the soak's group."""
    p = argparse.ArgumentParser(
        prog="python -m bench.robustness",
        description=bench.robustness.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--fuzz", type=int, default=10_000, help="generated requests to send")
    p.add_argument(
        "--engine",
        choices=[engine for engine in ENGINES if engine != "auto"],  # an engine named, to compare
        default="python",
        help="the engine of every server the run starts (docs/serving.md, Engines; default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="the generator's seed")
    p.add_argument("--model", type=Path, help="model artifact folder (default: a synthetic model)")
    p.add_argument("--index", type=Path, help="index artifact folder built from --model")
    p.add_argument(
        "--max-message-mb", type=float, default=FUZZ_MAX_MESSAGE_BYTES / 2**20, help="server message limit"
    )
    p.add_argument(
        "--no-undecodable", action="store_true", help="send only bytes that parse as the request message"
    )
    p.add_argument(
        "--violations", type=Path, help="write every violation and its request bytes (hex) to this file"
    )
    p.add_argument(
        "--deploys",
        action="store_true",
        help="instead of fuzzing: the abuse cases of deploys and hot reload, on the soak's two versions",
    )
    p.add_argument(
        "--group",
        action="store_true",
        help="instead of fuzzing: a serving group's failures (kill -9, SIGSTOP of a worker, a stop "
        "with a worker stopped), on the soak's first version",
    )
    p.add_argument(
        "--abuse",
        type=float,
        nargs="?",
        const=10.0,
        metavar="SECONDS",
        help="instead of fuzzing: oversized requests, a heavy-batch flood probed for SECONDS (10 if no "
        "value) and deadline expiry, against the soak's first version",
    )
    p.add_argument(
        "--abuse-ceiling-mb",
        type=float,
        default=2048.0,
        help="the flooded server's --max-memory-mb (default %(default)s)",
    )
    soak = p.add_argument_group("soak (instead of fuzzing)")
    soak.add_argument(
        "--soak",
        type=float,
        nargs="?",
        const=20.0,
        metavar="SECONDS",
        help="hold 80%% of the max QPS for SECONDS (20 if no value) with a hot reload halfway",
    )
    soak.add_argument(
        "--soak-data", type=Path, help="training data of both models (default: ml100k under --data-root)"
    )
    add_data_root_argument(p)
    soak.add_argument("--soak-tower", default="sa", help="user tower of both models (default %(default)s)")
    soak.add_argument("--soak-epochs", type=int, default=1, help="training epochs (default %(default)s)")
    soak.add_argument("--k", type=int, default=50, help="items per request (default %(default)s)")
    soak.add_argument("--load-fraction", type=float, default=0.8, help="of the max QPS (default %(default)s)")
    soak.add_argument(
        "--probe-seconds", type=float, default=4.0, help="max-QPS measurement (default %(default)s)"
    )
    soak.add_argument("--probe-concurrency", type=int, default=32, help="calls in flight while measuring it")
    soak.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="results and cached models (default %(default)s)"
    )
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, its values checked."""
    p = parser()
    args = p.parse_args(argv)
    if args.engine == "native":
        from retrieval.serving import NativeEngineMissing, native_module

        try:
            native_module()
        except NativeEngineMissing as e:
            p.error(str(e))
    if args.soak is not None:
        if args.soak <= 0 or not 0 < args.load_fraction <= 1 or args.probe_seconds <= 0 or args.k < 1:
            p.error("need --soak > 0, 0 < --load-fraction <= 1, --probe-seconds > 0 and --k >= 1")
        return args
    if (args.model is None) != (args.index is None):
        p.error("--model and --index go together")
    if args.fuzz < 1:
        p.error("--fuzz must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.abuse is not None:
        return abuse_main(args)
    if args.deploys:
        return deploys_main(args)
    if args.group:
        return group_main(args)
    return soak_main(args) if args.soak is not None else fuzz_main(args)
