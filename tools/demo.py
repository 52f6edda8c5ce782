"""The whole path on MovieLens-100K: train -> build index -> start server -> query -> stop.

    python tools/demo.py [--data PATH | --data-root DIR] [--workdir runs/demo] [--epochs 8]
    MITT_DATA=data python tools/demo.py     # reads data/ml-100k

Each step runs the project's own command-line tool, exactly as a user would.
Data: --data (an ML-100K folder), else ml-100k under --data-root or $MITT_DATA, else a
verified download from GroupLens into ~/.cache/mitt-retrieval.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from retrieval.api import RetrievalClient
from retrieval.environment import VERBOSE_HELP

TOOLS = Path(__file__).resolve().parent
DOWNLOADS = Path.home() / ".cache/mitt-retrieval"


def demo_data(data: Path | None, data_root: str | None) -> Path:
    """The ML-100K folder: ``data``, else ``ml100k`` under ``data_root`` or ``$MITT_DATA``, else the
    verified download into :data:`DOWNLOADS`.

    Raises:
        retrieval.data.DataError: a data root without ML-100K, or a download that does not verify.
    """
    from retrieval.data import DATA_ROOT_ENV, dataset_path, download_movielens_100k

    if data is not None:
        return data
    if data_root or os.environ.get(DATA_ROOT_ENV):
        return dataset_path("ml100k", data_root)
    return download_movielens_100k(DOWNLOADS)


def run_tool(name: str, *args: str) -> None:
    print(f"\n$ python tools/{name} {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, str(TOOLS / name), *args], check=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="ML-100K folder (default: under the data root, else download)")
    p.add_argument("--data-root", help="folder holding ml-100k (default $MITT_DATA)")
    p.add_argument("--workdir", type=Path, default=Path("runs/demo"), help="default %(default)s")
    p.add_argument("--model", default="sa", help="user tower (default %(default)s)")
    p.add_argument("--epochs", type=int, default=8, help="default %(default)s")
    p.add_argument("--users", type=int, nargs="+", default=[1, 2, 3], help="users to query (ML-100K ids)")
    p.add_argument("--verbose", action="store_true", help=f"for train, build_index and serve: {VERBOSE_HELP}")
    args = p.parse_args(argv)
    # Imported here, never for --help: the data layer loads pandas.
    from retrieval.data import DataError, ItemVocab, build_sequences, load_interactions

    try:
        data = demo_data(args.data, args.data_root)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    verbose = ["--verbose"] if args.verbose else []
    model_dir, index_dir = args.workdir / "model", args.workdir / "index"
    run_tool(
        "train.py", "--data", str(data), "--model", args.model, "--epochs", str(args.epochs),
        "--out", str(model_dir), "--overwrite", *verbose,
    )  # fmt: skip
    # With the interactions, the index's recall is measured on the users' own interest vectors.
    run_tool(
        "build_index.py", "--model", str(model_dir), "--out", str(index_dir), "--data", str(data),
        "--overwrite", *verbose,
    )  # fmt: skip

    port = free_port()
    serve = ["--model", str(model_dir), "--index", str(index_dir), "--port", str(port), *verbose]
    print(f"\n$ python tools/serve.py {' '.join(serve)} &", flush=True)
    server = subprocess.Popen([sys.executable, str(TOOLS / "serve.py"), *serve])
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
