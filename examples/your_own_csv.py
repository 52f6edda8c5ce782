r"""Bring your own CSV: a log with its own column names -> a model -> an index -> recommendations.

    python examples/your_own_csv.py                # writes a small shop log of its own first
    python examples/your_own_csv.py --csv clicks.csv --columns user=uid,item=product_id,timestamp=ts \
        --timestamp-unit ms --user 42

The column mapping names the log's user, item and timestamp columns, and side columns the same
way (``rating=stars``: the stars become the action feature). It is the configuration's
``data.columns``, as on the command line: ``--set data.columns.user=uid``. Timestamps are
integer seconds (``s``), milliseconds (``ms``) or ISO-8601 text (``iso``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def write_shop_log(path: Path) -> Path:
    """A log as a shop exports it: its own column names, times in milliseconds, 1-5 stars.
    Each customer browses one shelf of ten products, mostly in order."""
    rng = np.random.default_rng(0)
    rows = ["uid,product_id,ts,stars"]
    for customer in range(60):
        shelf, t = int(rng.integers(4)), 1_700_000_000_000 + customer * 1_000
        for step in range(int(rng.integers(6, 14))):
            rows.append(f"c{customer},p{shelf * 10 + step % 10},{t},{rng.integers(1, 6)}")
            t += int(rng.integers(60_000, 600_000))  # one to ten minutes later
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", type=Path, help="your log (default: a small shop log written to --workdir)")
    p.add_argument("--columns", default="user=uid,item=product_id,timestamp=ts,rating=stars")
    p.add_argument("--timestamp-unit", default="ms", choices=("s", "ms", "iso"))
    p.add_argument("--user", help="whose recommendations to print (default: the log's first user)")
    p.add_argument("--workdir", type=Path, default=Path("runs/example-csv"))
    p.add_argument("--epochs", type=int, default=10)
    args = p.parse_args(argv)

    # Imported once the arguments are known: TensorFlow takes a few seconds to load (and
    # quiet_tensorflow keeps its start-up log lines off the screen).
    from retrieval.environment import quiet_tensorflow

    quiet_tensorflow()
    from retrieval.artifacts import build_index_from_model, load_model, save_index
    from retrieval.data import DataError, build_sequences, parse_columns
    from retrieval.serving import Retriever
    from retrieval.training import Config, DataConfig, ModelConfig, TrainConfig, read_interactions, train

    csv = args.csv or write_shop_log(args.workdir / "clicks.csv")
    data = DataConfig(path=str(csv), columns=parse_columns(args.columns), timestamp_unit=args.timestamp_unit)
    config = Config(
        data=data,
        model=ModelConfig(tower="sa", dim=32, max_len=20),  # ComiRec-SA, 4 interests
        train=TrainConfig(epochs=args.epochs, batch_size=64, num_negatives=30),
    )
    try:
        # 1. Train: leave-one-out, so the result holds test metrics (and the popularity baseline's).
        result = train(config, args.workdir / "model", overwrite=True, verbose=0)
        # 2. Index the item embeddings: exact search here; a FAISS factory string (HNSW32,
        #    IVF1024,Flat) trades recall for speed on large catalogues.
        model = load_model(args.workdir / "model")
        save_index(build_index_from_model(model, "Flat"), args.workdir / "index", model, overwrite=True)
        retriever = Retriever.from_dirs(args.workdir / "model", args.workdir / "index")
        # 3. Ask for one user, with their history read from the same log, newest last.
        sequences = build_sequences(read_interactions(data))
    except DataError as e:  # a column that is not there, a timestamp the unit does not read, ...
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"trained on {csv}: test ndcg@10 {result.test['ndcg@10']:.3f}, "
          f"most popular {result.baseline_popularity_test['ndcg@10']:.3f}")  # fmt: skip
    user = args.user or sequences.users[0]
    if user not in sequences.users:
        print(f"error: no user {user!r} in {csv}", file=sys.stderr)
        return 2
    history = sequences.vocab.external(sequences.sequences[sequences.users.index(user)])
    print(f"user {user}, the last of {len(history)} items: {' '.join(history[-5:])}")
    for item, score, interest in retriever.retrieve(history, k=10).items:
        print(f"  {item:>8}  score {score:6.3f}  interest {interest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
