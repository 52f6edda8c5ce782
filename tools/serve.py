"""Serve a model and its index over gRPC until SIGTERM or SIGINT.

python tools/serve.py --model runs/ml100k-sa --index runs/ml100k-sa-index --port 50051
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from retrieval.artifacts import ArtifactError
from retrieval.retriever import Retriever
from retrieval.server import serve_forever


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=Path, help="model artifact folder")
    p.add_argument("--index", required=True, type=Path, help="index artifact folder built from that model")
    p.add_argument(
        "--host", default="127.0.0.1", help="interface to bind, 0.0.0.0 for all (default %(default)s)"
    )
    p.add_argument("--port", type=int, default=50051, help="0 picks a free port (default %(default)s)")
    p.add_argument("--workers", type=int, default=4, help="request threads (default %(default)s)")
    p.add_argument("--grace", type=float, default=5.0, help="seconds in-flight requests get on stop")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        retriever = Retriever.from_dirs(args.model, args.index)
    except ArtifactError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    serve_forever(retriever, args.host, args.port, max_workers=args.workers, grace=args.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
