"""Serve a model and its index over gRPC until SIGTERM or SIGINT.

python tools/serve.py --model runs/ml100k-sa --index runs/ml100k-sa-index --port 50051
python tools/serve.py ... --max-concurrent 8 --metrics-port 9090 \
    --tls-cert server.pem --tls-key server.key --tls-ca clients-ca.pem   # mutual TLS
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from retrieval.artifacts import ArtifactError
from retrieval.retriever import Retriever
from retrieval.server import DEFAULT_MAX_MESSAGE_BYTES, TlsFiles, serve_forever


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
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=0,
        help="calls computing at once, more get RESOURCE_EXHAUSTED (0 = no bound but --workers)",
    )
    p.add_argument(
        "--max-message-mb",
        type=float,
        default=DEFAULT_MAX_MESSAGE_BYTES / 2**20,
        help="largest request or response in MiB (default %(default)s)",
    )
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0 = off)")
    p.add_argument("--tls-cert", type=Path, help="server certificate (PEM): serve TLS")
    p.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    p.add_argument("--tls-ca", type=Path, help="CA of client certificates (PEM): require mutual TLS")
    args = p.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None) or (args.tls_ca and not args.tls_cert):
        p.error("TLS needs --tls-cert and --tls-key together (and --tls-ca only with them)")
    if args.max_concurrent < 0 or args.metrics_port < 0:
        p.error("--max-concurrent and --metrics-port must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        retriever = Retriever.from_dirs(args.model, args.index)
    except ArtifactError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca) if args.tls_cert else None
    serve_forever(
        retriever,
        args.host,
        args.port,
        max_workers=args.workers,
        grace=args.grace,
        max_concurrent=args.max_concurrent or None,
        max_message_bytes=int(args.max_message_mb * 2**20),
        tls=tls,
        metrics_port=args.metrics_port or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
