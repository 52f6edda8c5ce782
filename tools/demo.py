"""The whole path on MovieLens-100K: train -> build index -> start server -> query -> stop.

    python tools/demo.py [--data PATH] [--workdir runs/demo] [--epochs 8]

Each step runs the project's own command-line tool, exactly as a user would.
Data: --data, else ../shared/data/ml-100k beside the checkout, else a verified download
from GroupLens into ~/.cache/mitt-retrieval.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from retrieval.api import RetrievalClient
from retrieval.data import (
    ItemVocab,
    build_sequences,
    default_data_path,
    download_movielens_100k,
    load_interactions,
)

TOOLS = Path(__file__).resolve().parent


def run_tool(name: str, *args: str) -> None:
    print(f"\n$ python tools/{name} {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, str(TOOLS / name), *args], check=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="ML-100K folder (default: shared copy, else download)")
    p.add_argument("--workdir", type=Path, default=Path("runs/demo"), help="default %(default)s")
    p.add_argument("--model", default="sa", help="user tower (default %(default)s)")
    p.add_argument("--epochs", type=int, default=8, help="default %(default)s")
    p.add_argument("--users", type=int, nargs="+", default=[1, 2, 3], help="users to query (ML-100K ids)")
    args = p.parse_args(argv)

    data = args.data or default_data_path() or download_movielens_100k(Path.home() / ".cache/mitt-retrieval")
    model_dir, index_dir = args.workdir / "model", args.workdir / "index"
    run_tool(
        "train.py", "--data", str(data), "--model", args.model, "--epochs", str(args.epochs),
        "--out", str(model_dir), "--overwrite",
    )  # fmt: skip
    run_tool("build_index.py", "--model", str(model_dir), "--out", str(index_dir), "--overwrite")

    port = free_port()
    print(f"\n$ python tools/serve.py --model {model_dir} --index {index_dir} --port {port} &", flush=True)
    server = subprocess.Popen(
        [sys.executable, str(TOOLS / "serve.py"), "--model", str(model_dir), "--index", str(index_dir),
         "--port", str(port)]
    )  # fmt: skip
    try:
        sequences = build_sequences(load_interactions(data))
        vocab = ItemVocab.load(model_dir / "vocab.json")
        with RetrievalClient(f"127.0.0.1:{port}", timeout=10) as client:
            client.wait_until_serving(timeout=120)
            for user in args.users:
                history = sequences.vocab.external(sequences.sequences[sequences.users.index(str(user))])
                result = client.retrieve(history, k=10)
                print(f"\nUser {user}: {len(history)} ratings; the last five:")
                for item in history[-5:]:
                    print(f"    {vocab.title(vocab.lookup([item])[0])}")
                print(f"  Recommended (model {result.model_version}):")
                for item_id, score, interest in result.items:
                    print(
                        f"    {score:7.3f}  [interest {interest}]  {vocab.title(vocab.lookup([item_id])[0])}"
                    )
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        print(f"\nserver stopped (exit code {code})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
