"""Trains one RecBole sequential model on a split written by ``bench.peers`` and exports its vectors.

Runs in RecBole's own virtual environment (torch CPU + recbole), never in the project's: it
imports nothing of the project. Standalone::

    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 python recbole_runner.py --model SASRec \\
        --split split.json --atomic DIR --out DIR

RecBole reads the atomic file ``DIR/bench/bench.inter`` (our external ids, the position in the
user's sequence as timestamp) and cuts it with its own leave-one-out (``LS: valid_and_test``,
``order: TO``); the runner reports what RecBole made of it (every evaluated user's validation
and test target and history, the training instances) so that the benchmark can check it equals
our split. Training is RecBole's: its dataloader, its model, its ``Trainer._train_epoch`` (the
body of ``Trainer.fit`` without RecBole's own evaluation, which does not exclude history items);
hyper-parameters are the model's RecBole defaults (``properties/model/<Model>.yaml``) except the
embedding size, history length, batch size and epochs, given to match ours.

After every epoch it writes, under ``--out``: ``epoch_NNN/valid_users.npy`` and
``test_users.npy`` (float32 ``[U, 1, d']``, the split's evaluation users in order, their
histories being our split's), ``epoch_NNN/items.npy`` (float32 ``[n, d']``, row i =
``item_ids.json[i]``, our external ids), and ``progress.json``. A user vector dotted with an
item vector is exactly the model's ``full_sort_predict`` score (checked on one batch every
epoch): BERT4Rec's per-item output bias is carried as one extra dimension (user side 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # RecBole's torch.load of its own files

import numpy as np
from epochs import runner_parser, train_epochs  # beside this script, on its sys.path

MODELS = ("SASRec", "BERT4Rec")
DATASET = "bench"


def recbole_config(args: argparse.Namespace) -> dict:
    """The settings given to RecBole on top of its defaults and the model's own."""
    return {
        "data_path": str(args.atomic),
        "checkpoint_dir": str(args.out / "saved"),
        "load_col": {"inter": ["user_id", "item_id", "timestamp"]},
        "USER_ID_FIELD": "user_id",
        "ITEM_ID_FIELD": "item_id",
        "TIME_FIELD": "timestamp",
        "user_inter_num_interval": "[0,inf)",
        "item_inter_num_interval": "[0,inf)",
        "rm_dup_inter": None,
        "MAX_ITEM_LIST_LENGTH": args.max_len,
        "hidden_size": args.dim,
        "train_batch_size": args.batch_size,
        "epochs": args.epochs,
        "loss_type": "CE",
        "train_neg_sample_args": None,  # cross-entropy over every item: no negatives
        "eval_args": {"split": {"LS": "valid_and_test"}, "group_by": "user", "order": "TO", "mode": "full"},
        "seed": args.seed,
        "reproducibility": True,
        "use_gpu": False,
        "show_progress": False,
        "worker": 0,
        "state": "WARNING",
    }


def sequences_tensor(histories: list[list[int]], max_len: int):
    """RecBole's sequence input: the newest ``max_len`` items, left-aligned, zero-padded at the
    end, and the lengths (``item_id_list``, ``item_length``)."""
    import torch

    seq = torch.zeros((len(histories), max_len), dtype=torch.long)
    lengths = torch.zeros(len(histories), dtype=torch.long)
    for row, h in enumerate(histories):
        tail = h[-max_len:]
        seq[row, : len(tail)] = torch.tensor(tail, dtype=torch.long)
        lengths[row] = len(tail)
    return seq, lengths


def user_and_item_vectors(model, seq, lengths):
    """Vectors whose inner products are ``model.full_sort_predict``'s scores.

    Returns:
        ``(users [B, d'], items [n_items, d'])`` (row 0 of the items is RecBole's padding id).
    """
    import torch

    if type(model).__name__ == "BERT4Rec":  # full_sort_predict: mask appended, then an output bias
        output = model.forward(model.reconstruct_test_data(seq, lengths))
        users = model.gather_indexes(output, lengths - 1)
        items = model.item_embedding.weight[: model.n_items]
        users = torch.cat([users, torch.ones(len(users), 1)], dim=1)
        items = torch.cat([items, model.output_bias[:, None]], dim=1)
        return users, items
    return model.forward(seq, lengths), model.item_embedding.weight


def split_report(dataset, parts: dict, max_len: int) -> dict:
    """What RecBole's leave-one-out made: per evaluated user the target and the history (its
    newest ``max_len`` items) of ``valid`` and ``test`` in external ids, and the training
    instances."""
    report: dict = {}
    for name, data in parts.items():
        feat = data._dataset.inter_feat
        users = dataset.id2token("user_id", feat["user_id"].numpy())
        targets = dataset.id2token("item_id", feat["item_id"].numpy())
        if name == "train":
            report["train_instances"] = len(users)
            continue
        seqs = feat["item_id_list"].numpy()
        lengths = feat["item_length"].numpy()
        report[name] = {str(u): str(t) for u, t in zip(users, targets, strict=True)}
        report[f"{name}_histories"] = {
            str(u): [str(i) for i in dataset.id2token("item_id", s[:n])][-max_len:]
            for u, s, n in zip(users, seqs, lengths, strict=True)
        }
    return report


def main(argv: list[str] | None = None) -> int:
    p = runner_parser(__doc__, MODELS)
    p.add_argument("--atomic", type=Path, required=True, help="folder holding bench/bench.inter")
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    args.atomic = args.atomic.resolve()

    import torch
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.utils import get_model, get_trainer, init_seed

    split = json.loads(args.split.read_text())
    config = Config(model=args.model, dataset=DATASET, config_dict=recbole_config(args))
    init_seed(config["seed"], config["reproducibility"])
    dataset = create_dataset(config)
    train_data, valid_data, test_data = data_preparation(config, dataset)
    init_seed(config["seed"], config["reproducibility"])
    model = get_model(config["model"])(config, train_data._dataset).to(config["device"])
    trainer = get_trainer(config["MODEL_TYPE"], config["model"])(config, model)

    args.out.mkdir(parents=True, exist_ok=True)
    report = split_report(
        dataset, {"train": train_data, "valid": valid_data, "test": test_data}, args.max_len
    )
    token_id = dataset.field2token_id["item_id"]  # our external id -> RecBole's id
    item_ids = [str(t) for t in dataset.id2token("item_id", np.arange(1, dataset.item_num))]
    (args.out / "item_ids.json").write_text(json.dumps(item_ids))
    evaluation = {
        part: sequences_tensor([[token_id[i] for i in h] for h in split[part]["histories"]], args.max_len)
        for part in ("valid", "test")
    }
    keys = "hidden_size n_layers n_heads inner_size hidden_dropout_prob attn_dropout_prob loss_type"
    keys += " learning_rate train_batch_size MAX_ITEM_LIST_LENGTH epochs seed"
    keys += " mask_ratio ft_ratio" if args.model == "BERT4Rec" else ""
    settings = {k: config[k] for k in keys.split()}
    progress = {
        "peer": "recbole",
        "model": args.model,
        "train_examples": report["train_instances"],
        "hyper_parameters": settings,
        "versions": {"torch": torch.__version__, "recbole": __import__("recbole").__version__},
        "split_check": report,
        "torch_threads": torch.get_num_threads(),
        "epochs": [],
        "done": False,
    }

    def train(epoch: int) -> float:
        return float(trainer._train_epoch(train_data, epoch - 1, show_progress=False))

    def export(folder: Path) -> None:
        model.eval()
        with torch.no_grad():
            for part, (seq, lengths) in evaluation.items():
                users = []
                for start in range(0, len(seq), 1024):
                    u, items = user_and_item_vectors(
                        model, seq[start : start + 1024], lengths[start : start + 1024]
                    )
                    users.append(u)
                np.save(folder / f"{part}_users.npy", torch.cat(users).numpy()[:, None, :].astype(np.float32))
            # The exported vectors must reproduce RecBole's own scores.
            from recbole.data.interaction import Interaction

            seq, lengths = evaluation["test"][0][:64], evaluation["test"][1][:64]
            scores = model.full_sort_predict(Interaction({"item_id_list": seq, "item_length": lengths}))
            u, items = user_and_item_vectors(model, seq, lengths)
            error = float((u @ items.T - scores).abs().max())
            if error > 1e-3:
                raise AssertionError(f"exported vectors differ from full_sort_predict by {error}")
            np.save(folder / "items.npy", items[1:].detach().numpy().astype(np.float32))

    train_epochs(args.out, progress, args.epochs, args.max_minutes, train, export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
