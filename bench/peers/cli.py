"""The command line of ``python -m bench.peers``: installs the peers, runs every model, reports."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench.peers
from bench.context import load_average, run_meta
from bench.data import add_data_root_argument, dataset_file
from bench.peers.envs import DEFAULT_CACHE, PEER_ENVS, ensure_env, find_torch_wheel
from bench.peers.ours import ours_worker
from bench.peers.plan import Settings, model_runs
from bench.peers.report import write_report
from bench.peers.runs import execute
from bench.peers.splits import PROTOCOLS, dataset_slug, load_data, make_split, write_split


def run_benchmark(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """Installs the peers, writes the splits, runs every model (or reads it back), compares and
    writes ``results.json`` and ``results.md`` into ``args.out``."""
    load_start = load_average()
    installs = install_peers(args)
    runs = model_runs(list(installs), args.protocols, args.models, args.multi_interest)
    if "ours" not in args.sides:
        runs = [r for r in runs if r.side != "ours"]
    folder = args.out.resolve() / dataset_slug(args.data, args.max_users)  # runners run elsewhere
    source = str(Path(args.data).resolve())
    data_path, data = load_data(source, args.max_users, folder)
    settings = Settings(
        source, args.max_users, args.epochs, args.batch_size, args.dim, args.max_len, args.seed,
        args.interests, args.negatives, args.peer_minutes, tuple(args.set), not args.no_presets,
    )  # fmt: skip
    meta: dict[str, Any] = {
        **run_meta("python -m bench.peers " + " ".join(argv), load_start),
        **dataclasses.asdict(settings),
    }
    results = []
    for protocol in args.protocols:
        selected = [r for r in runs if r.protocol == protocol]
        if not selected:
            continue
        split = make_split(data, protocol, args.seed)
        split_dir = folder / protocol
        write_split(split, split_dir)
        for run in selected:
            env = installs.get(run.side, {})
            run_dir = split_dir / run.name
            results.append(execute(run, split, split_dir, run_dir, data_path, settings, env, args.data_root))
            meta["load_end"] = load_average()
            write_report(args.out, meta, installs, results)
    return write_report(args.out, meta, installs, results)


def install_peers(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each peer of ``--sides``' venv (installed the first time): peer -> its install record."""
    installs = {}
    for peer in (side for side in args.sides if side != "ours"):
        print(f"=== installing {peer} into {args.cache / peer} (once)", flush=True)
        installs[peer] = ensure_env(PEER_ENVS[peer], args.cache, find_torch_wheel(args.torch_wheel))
        installs[peer].pop("packages", None)
    return installs


def parser() -> argparse.ArgumentParser:
    """The command line's options (:func:`parse_args` fills in the defaults that depend on others)."""
    p = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description=bench.peers.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", help="interactions (default: beauty under --data-root; --smoke: ml100k)")
    add_data_root_argument(p)
    p.add_argument("--out", type=Path, help="default runs/bench-peers (--smoke: runs/bench-peers-smoke)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="peer venvs (default %(default)s)")
    p.add_argument(
        "--torch-wheel", type=Path, help="local torch 2.13.0 CPU wheel (default: found in /opt/wheels)"
    )
    p.add_argument(
        "--sides", nargs="+", default=["ours", "recbole", "deepmatch"], choices=["ours", *PEER_ENVS]
    )
    p.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    p.add_argument(
        "--models", nargs="+", help="only these models (our tower names or the peers', e.g. SASRec)"
    )
    p.add_argument(
        "--multi-interest", default="sa", help="our multi-interest tower in the loo table (%(default)s)"
    )
    p.add_argument(
        "--epochs",
        type=int,
        help="every side's epoch budget (default: per pair, our tower's preset's, e.g. 39 for "
        "beauty-sasrec; --smoke: 1)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="every side (default %(default)s)")
    p.add_argument("--dim", type=int, default=64, help="embedding size, every side (default %(default)s)")
    p.add_argument("--max-len", type=int, default=50, help="history length, every side (default %(default)s)")
    p.add_argument("--interests", type=int, default=4, help="K of sa/dr/mind and their peers (%(default)s)")
    p.add_argument("--negatives", type=int, default=255, help="DeepMatch's sampled negatives (%(default)s)")
    p.add_argument("--seed", type=int, default=42, help="default %(default)s")
    p.add_argument("--peer-minutes", type=float, default=0.0, help="cap a peer's training time (0 = none)")
    p.add_argument("--max-users", type=int, help="only the first N users (default 0 = all; --smoke: 200)")
    p.add_argument(
        "--set", action="append", default=[], metavar="A.B=C", help="our config override (every tower)"
    )
    p.add_argument(
        "--no-presets",
        action="store_true",
        help="our towers from the defaults, not their preset for --data (retrieval/training/presets.py)",
    )
    p.add_argument("--smoke", "--quick", action="store_true", help="ML-100K, first 200 users, 1 epoch")
    p.add_argument("--install-only", action="store_true", help="install the peers' venvs and stop")
    p.add_argument("--ours-worker", type=Path, help=argparse.SUPPRESS)
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; ``--smoke`` sets the ML-100K slice and one epoch unless they are given."""
    args = parser().parse_args(argv)
    args.data = args.data or str(dataset_file("ml100k" if args.smoke else "beauty", args.data_root))
    if args.smoke:
        args.epochs = 1 if args.epochs is None else args.epochs
        args.max_users = 200 if args.max_users is None else args.max_users
    args.max_users = args.max_users or 0
    args.out = args.out or Path("runs/bench-peers-smoke" if args.smoke else "runs/bench-peers")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.ours_worker is not None:
        return ours_worker(args.ours_worker)
    if args.install_only:
        for peer in (s for s in args.sides if s != "ours"):
            record = ensure_env(PEER_ENVS[peer], args.cache, find_torch_wheel(args.torch_wheel))
            print(f"{peer}: {record['venv']} (install {record['install_seconds']} s)")
        return 0
    started = time.perf_counter()
    run_benchmark(args, argv)
    print((args.out / "results.md").read_text())
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0
