"""Ask a running retrieval server for the top-k items of a history.

python tools/query.py --address 127.0.0.1:50051 --history 50 172 133 --k 10 --titles runs/ml100k-sa
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from retrieval.artifacts import read_manifest
from retrieval.client import RetrievalClient
from retrieval.model_artifact import KIND as MODEL_KIND
from retrieval.retriever import Retrieved
from retrieval.vocab import ItemVocab


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default="127.0.0.1:50051", help="server host:port (default %(default)s)")
    p.add_argument(
        "--history", nargs="+", required=True, metavar="ID", help="external item ids, oldest first"
    )
    p.add_argument("--k", type=int, default=10, help="items wanted (default %(default)s)")
    p.add_argument(
        "--titles", type=Path, metavar="MODEL_DIR", help="model folder whose vocabulary has titles"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=5.0, help="call deadline in seconds")
    return p.parse_args(argv)


def load_titles(model_dir: Path) -> dict[str, str]:
    """External id -> title from a model folder's vocabulary (no TensorFlow needed)."""
    read_manifest(model_dir, MODEL_KIND, verify=False)
    vocab = ItemVocab.load(model_dir / "vocab.json")
    return dict(zip(vocab.ids, vocab.titles or vocab.ids, strict=True))


def format_table(result: Retrieved, titles: dict[str, str] | None) -> str:
    """Rank, id, score, interest (and title) per line, under a header line."""
    lines = [f"model {result.model_version}, {result.unknown_items} unknown history ids"]
    lines.append(f"{'rank':>4}  {'item':<16} {'score':>9} {'interest':>8}" + ("  title" if titles else ""))
    for rank, (item, score, interest) in enumerate(result.items, 1):
        title = f"  {titles.get(item, '?')}" if titles else ""
        lines.append(f"{rank:>4}  {item:<16} {score:>9.4f} {interest:>8}{title}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    titles = load_titles(args.titles) if args.titles else None
    with RetrievalClient(args.address, timeout=args.timeout) as client:
        try:
            result = client.retrieve(args.history, args.k)
        except grpc.RpcError as e:
            print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    if args.json:
        items = [
            {"item_id": item, "score": score, "interest": interest}
            | ({"title": titles.get(item, "?")} if titles else {})
            for item, score, interest in result.items
        ]
        print(
            json.dumps(
                {"model_version": result.model_version, "unknown_items": result.unknown_items, "items": items}
            )
        )
    else:
        print(format_table(result, titles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
