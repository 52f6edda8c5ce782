"""Train from Python, without files: a pandas DataFrame -> ``train(config, data=frame)`` -> an index
-> a :class:`~retrieval.serving.Retriever` answering in-process.

    python examples/python_api.py [--workdir runs/example-api] [--epochs 10]

The frame's columns are named in ``DataConfig.columns``; a datetime column needs no timestamp
unit. The model artifact's ``config.json`` names the frame by its shape and SHA-256 (there is no
path to read it from again).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd


def listening_history() -> pd.DataFrame:
    """Plays as an application holds them: listeners, tracks and pandas datetimes. Each listener
    follows one of four playlists of ten tracks, mostly in order."""
    rng = np.random.default_rng(1)
    rows = []
    for listener in range(60):
        playlist, at = int(rng.integers(4)), pd.Timestamp("2024-05-01") + pd.Timedelta(hours=listener)
        for step in range(int(rng.integers(6, 14))):
            rows.append((f"listener-{listener}", f"track-{playlist * 10 + step % 10}", at))
            at += pd.Timedelta(minutes=int(rng.integers(3, 6)))
    return pd.DataFrame(rows, columns=["listener", "track", "played_at"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("runs/example-api"))
    p.add_argument("--epochs", type=int, default=10)
    args = p.parse_args(argv)

    from retrieval.environment import quiet_tensorflow

    quiet_tensorflow()  # before TensorFlow loads: its start-up log lines off the screen
    from retrieval.artifacts import build_index_from_model, load_model
    from retrieval.serving import Retriever
    from retrieval.training import Config, DataConfig, ModelConfig, TrainConfig, train

    frame = listening_history()
    config = Config(
        data=DataConfig(columns={"user": "listener", "item": "track", "timestamp": "played_at"}),
        model=ModelConfig(tower="sa", dim=32, max_len=20),
        train=TrainConfig(epochs=args.epochs, batch_size=64, num_negatives=30),
    )
    result = train(config, args.workdir / "model", overwrite=True, verbose=0, data=frame)
    print(f"{len(frame)} plays: test hr@10 {result.test['hr@10']:.3f}, ndcg@10 {result.test['ndcg@10']:.3f}")

    model = load_model(args.workdir / "model")
    retriever = Retriever(model, build_index_from_model(model, "Flat"))  # exact search, in memory
    history = ["track-10", "track-11", "track-12"]
    print(f"after {' '.join(history)}:")
    for track, score, interest in retriever.retrieve(history, k=5).items:
        print(f"  {track:>9}  score {score:6.3f}  interest {interest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
