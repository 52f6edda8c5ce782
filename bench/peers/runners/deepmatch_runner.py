"""Trains one DeepMatch model on a split written by ``bench.peers`` and exports its vectors.

Runs in DeepMatch's own virtual environment (tensorflow-cpu + tf-keras + deepmatch), never in
the project's: it imports nothing of the project. Standalone::

    TF_USE_LEGACY_KERAS=1 python deepmatch_runner.py --model ComiRec-SA --split split.json --out DIR

DeepMatch's own models, input format (the history newest first, padded at the end, with its
length) and training loop (``model.fit`` with ``sampledsoftmaxloss`` over its negative
sampler), in graph mode as DeepMatch requires. Hyper-parameters are those of DeepMatch's
examples (``examples/run_comirec.py``, ``run_mind.py``): user DNN ``(128, 64, dim)`` for
ComiRec and MIND, ``(64, dim)`` for YouTubeDNN, Adam 1e-3; the embedding size, history
length, batch size, interests and negatives come from the command line, so that they match
ours.

After every epoch it writes, under ``--out``: ``epoch_NNN/valid_users.npy`` and
``test_users.npy`` (float32 ``[U, K, d]``, the split's evaluation users in order),
``epoch_NNN/items.npy`` (float32 ``[n, d]``, row i = ``item_ids.json[i]``, our external ids),
and ``progress.json`` (training seconds and loss per epoch, hyper-parameters).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # DeepMatch is tf.keras (Keras 2) code
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from epochs import runner_parser, train_epochs  # beside this script, on its sys.path

MODELS = ("ComiRec-SA", "ComiRec-DR", "MIND", "YouTubeDNN")


def _offline_version_check() -> None:
    """deepctr and deepmatch ask PyPI for their latest version in a thread at import: the
    benchmark stays offline and quiet."""
    import requests

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("offline benchmark")

    requests.get = refuse  # type: ignore[assignment]


def history_inputs(histories: list[list[int]], max_len: int) -> dict[str, np.ndarray]:
    """DeepMatch's history input (``examples/preprocess.py``): newest first, the newest
    ``max_len`` kept, zero-padded at the end, with the length."""
    items = np.zeros((len(histories), max_len), np.int32)
    lengths = np.zeros((len(histories), 1), np.int32)
    for row, h in enumerate(histories):
        newest_first = h[::-1][:max_len]
        items[row, : len(newest_first)] = newest_first
        lengths[row, 0] = len(newest_first)
    return {"hist_item": items, "hist_len": lengths}


def prefix_samples(sequences: list[list[int]], max_len: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every prefix of every training sequence -> its next item (``gen_data_set``)."""
    histories, targets = [], []
    for seq in sequences:
        for i in range(1, len(seq)):
            histories.append(seq[:i])
            targets.append(seq[i])
    x = history_inputs(histories, max_len)
    x["item"] = np.asarray(targets, np.int32).reshape(-1, 1)
    return x, np.ones((len(targets), 1), np.float32)


def build_model(name: str, num_ids: int, args: argparse.Namespace, item_count: list[int]):
    """The DeepMatch model ``name`` over item ids ``1..num_ids - 1`` (0 = padding)."""
    from deepctr.feature_column import SparseFeat, VarLenSparseFeat
    from deepmatch.models import MIND, ComiRec, YoutubeDNN
    from deepmatch.utils import NegativeSampler

    dim = args.dim
    user_columns = [
        VarLenSparseFeat(
            SparseFeat("hist_item", num_ids, dim, embedding_name="item"), args.max_len, "mean", "hist_len"
        )
    ]
    item_columns = [SparseFeat("item", num_ids, dim)]
    sampler = NegativeSampler(
        args.sampler, num_sampled=args.negatives, item_name="item", item_count=item_count
    )
    if name == "YouTubeDNN":
        return YoutubeDNN(user_columns, item_columns, user_dnn_hidden_units=(64, dim), sampler_config=sampler)
    if name == "MIND":
        return MIND(
            user_columns,
            item_columns,
            k_max=args.interests,
            dynamic_k=True,  # as ours: K'_u = max(1, min(K, log2 n)) interests per user
            user_dnn_hidden_units=(128, 64, dim),
            sampler_config=sampler,
        )
    extractor = {"ComiRec-SA": "sa", "ComiRec-DR": "dr"}[name]
    return ComiRec(
        user_columns,
        item_columns,
        k_max=args.interests,
        interest_extractor=extractor,  # add_pos: DeepMatch's default (True)
        user_dnn_hidden_units=(128, 64, dim),
        sampler_config=sampler,
    )


def main(argv: list[str] | None = None) -> int:
    p = runner_parser(__doc__, MODELS)
    p.add_argument("--interests", type=int, default=4)
    p.add_argument("--negatives", type=int, default=255)
    p.add_argument("--sampler", default="frequency", choices=["frequency", "uniform", "inbatch"])
    p.add_argument("--learning-rate", type=float, default=1e-3)
    args = p.parse_args(argv)

    split = json.loads(args.split.read_text())
    items: list[str] = split["items"]
    index = {item: i + 1 for i, item in enumerate(items)}  # our external id -> DeepMatch id (0 = padding)

    def ids(sequence: list[str]) -> list[int]:
        return [index[i] for i in sequence]

    train = [ids(s) for s in split["train"]]
    x, y = prefix_samples(train, args.max_len)
    counts = np.bincount(x["item"].ravel(), minlength=len(items) + 1)
    evaluation = {
        part: history_inputs([ids(h) for h in split[part]["histories"]], args.max_len)
        for part in ("valid", "test")
    }

    _offline_version_check()
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()  # DeepMatch's layers are graph-mode code
    tf.compat.v1.set_random_seed(args.seed)
    np.random.seed(args.seed)
    from deepmatch.utils import sampledsoftmaxloss

    model = build_model(args.model, len(items) + 1, args, counts.tolist())
    model.compile(optimizer=tf.keras.optimizers.legacy.Adam(args.learning_rate), loss=sampledsoftmaxloss)
    user_model = tf.keras.models.Model(inputs=model.user_input, outputs=model.user_embedding)
    item_model = tf.keras.models.Model(inputs=model.item_input, outputs=model.item_embedding)
    all_items = {"item": np.arange(1, len(items) + 1, dtype=np.int32).reshape(-1, 1)}

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "item_ids.json").write_text(json.dumps(items))
    progress = {
        "peer": "deepmatch",
        "model": args.model,
        "train_examples": len(y),
        "hyper_parameters": {k: v for k, v in vars(args).items() if k not in ("split", "out")},
        "versions": {"tensorflow": tf.__version__, "deepmatch": __import__("deepmatch").__version__},
        "epochs": [],
        "done": False,
    }

    def train(epoch: int) -> float:
        history = model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=True, verbose=0)
        return float(history.history["loss"][-1])

    def export(folder: Path) -> None:
        for part, inputs in evaluation.items():
            vectors = user_model.predict(inputs, batch_size=4096)
            if vectors.ndim == 2:  # single-interest: [U, d] -> [U, 1, d]
                vectors = vectors[:, None, :]
            np.save(folder / f"{part}_users.npy", vectors.astype(np.float32))
        np.save(folder / "items.npy", item_model.predict(all_items, batch_size=4096).astype(np.float32))

    train_epochs(args.out, progress, args.epochs, args.max_minutes, train, export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
