"""Our side: each tower's training configuration (its preset for the dataset, then the shared
sizes and budget) and the worker that trains and exports it in a process of its own."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.data import default_data_root
from bench.peers.plan import PAIRS, ModelRun, Settings
from bench.peers.splits import make_split

if TYPE_CHECKING:
    from retrieval.training import Config


def ours_preset(model: str, s: Settings, root: Path | None = None) -> str | None:
    """The preset our ``model`` starts from with ``s.presets`` (else None: the defaults):
    ``<dataset>-<model>`` when ``s.data`` is a named dataset's file under the data ``root``
    (default :func:`bench.data.default_data_root`; ``retrieval.data.dataset_at``), else ``<model>``."""
    from retrieval.data import dataset_at
    from retrieval.training import preset_for

    return preset_for(dataset_at(s.data, root or default_data_root()), model) if s.presets else None


def ours_base_config(model: str, s: Settings, root: Path | None = None) -> Config:
    """The defaults of ``retrieval.training.Config`` with the overrides of our ``model``'s preset
    (:func:`ours_preset`; not its data path: :func:`ours_config` sets the benchmark's)."""
    from retrieval.config import apply_overrides
    from retrieval.training import Config, get_preset

    preset = ours_preset(model, s, root)
    return apply_overrides(Config(), get_preset(preset).overrides) if preset else Config()


def counterpart(run: ModelRun) -> str:
    """Our tower that ``run`` is compared with: its own tower, or a peer model's counterpart in
    :data:`~bench.peers.plan.PAIRS`."""
    if run.side == "ours":
        return run.model
    return next(t for p, t, side, m in PAIRS if (p, side, m) == (run.protocol, run.side, run.model))


PAIR_EPOCHS = 20
"""A pair's epochs without ``--epochs`` or a tuned budget in :data:`TUNED_EPOCHS`: the peers count
their budget in epochs, our presets in steps; 20 was our default before that."""
TUNED_EPOCHS = {"beauty-sasrec": 39, "sports-sasrec": 39}
"""Presets whose step budget was tuned as epochs (``beauty-sasrec``: 39 of Beauty's 88 steps)."""


def run_settings(run: ModelRun, s: Settings, root: Path | None = None) -> Settings:
    """``s`` with the epoch budget of ``run`` resolved: ``s.epochs`` when given, else that of our
    counterpart tower (:func:`counterpart`): its preset's tuned epochs (:data:`TUNED_EPOCHS`,
    e.g. 39 for ``beauty-sasrec``), or :data:`PAIR_EPOCHS`. Both sides of a pair so train for the
    same number of epochs."""
    if s.epochs is not None:
        return s
    preset = ours_preset(counterpart(run), s, root)
    return dataclasses.replace(s, epochs=TUNED_EPOCHS.get(preset or "", PAIR_EPOCHS))


def ours_config(run: ModelRun, data: str, s: Settings, root: Path | None = None) -> dict[str, Any]:
    """Our training configuration for ``run``: the defaults of ``retrieval.training.Config``, then
    the overrides of the tower's preset (:func:`ours_preset`: its tuned losses, negatives,
    dropout), then the shared sizes and budget, ``run``'s protocol (split with the benchmark's
    seed, so it is :func:`~bench.peers.splits.make_split`'s), validation every epoch and early
    stopping's best-epoch export without stopping (patience = epochs), so that both sides are
    scored at their best validation epoch of the same budget; ``s.overrides`` last."""
    from retrieval.config import apply_overrides

    epochs = run_settings(run, s, root).epochs
    assert epochs is not None
    shared = [
        f"data.path={data}",
        f"data.protocol={run.protocol}",
        f"data.split_seed={s.seed}",
        f"model.tower={run.model}",
        f"model.dim={s.dim}",
        f"model.max_len={s.max_len}",
        f"train.epochs={epochs}",
        f"train.batch_size={s.batch_size}",
        f"train.seed={s.seed}",
        f"train.patience={max(epochs, 1)}",
        "train.eval_every=1",
    ]
    if run.model in ("sa", "dr", "mind"):
        shared.append(f"model.num_interests={s.interests}")
    return apply_overrides(ours_base_config(run.model, s, root), [*shared, *s.overrides]).to_dict()


def ours_worker(spec_file: Path) -> int:
    """Trains one of our towers (``python -m bench.peers --ours-worker SPEC``, its own process so
    that its memory is its own) with ``retrieval.training.train``, as ``tools/train.py`` would, and
    exports it as the runners export theirs: the evaluation users' vectors and the item vectors of
    the kept (best) weights, the item ids and ``progress.json``."""
    from retrieval.artifacts import encode_histories, load_model
    from retrieval.data import build_sequences, load_interactions
    from retrieval.training import Config, train

    spec = json.loads(spec_file.read_text())
    config = Config.from_dict(spec["config"])
    out, protocol = Path(spec["out"]), spec["protocol"]
    data = build_sequences(load_interactions(config.data.path, config.data.format))
    split = make_split(data, protocol, config.data.split_seed)
    metrics = train(config, out / "model", overwrite=True, verbose=2).to_dict()

    model = load_model(out / "model")
    final = out / "export" / "final"
    final.mkdir(parents=True, exist_ok=True)
    for part in ("valid", "test"):
        _, histories, _ = split.part(part)
        np.save(final / f"{part}_users.npy", encode_histories(model, histories).astype(np.float32))
    np.save(final / "items.npy", model.item_embeddings[1:].astype(np.float32))
    (out / "export" / "item_ids.json").write_text(json.dumps(list(model.vocab.ids)))
    (out / "export" / "progress.json").write_text(json.dumps(progress_of(config, metrics), indent=2))
    return 0


def progress_of(config: Config, metrics: dict[str, Any]) -> dict[str, Any]:
    """Our training's ``metrics.json`` as the runners' ``progress.json``: per epoch the training
    seconds, the loss and the validation metrics; the kept epoch; the test metrics training
    reported (checked against the exported vectors' under ``loo``)."""
    validation = {int(v["epoch"]): v for v in metrics["validation_per_epoch"]}
    losses = metrics["train_loss_per_epoch"]
    return {
        "peer": "ours",
        "model": config.model.tower,
        "train_examples": metrics["train_examples"],
        "objective": metrics["objective"],
        "hyper_parameters": config.to_dict(),
        "epochs": [
            {
                "epoch": e,
                "train_seconds": metrics["train_seconds_per_epoch"][e - 1],
                "loss": losses[e - 1] if e - 1 < len(losses) else None,
                "validation": {k: v for k, v in validation.get(e, {}).items() if k != "epoch"},
            }
            for e in range(1, metrics["epochs_trained"] + 1)
        ],
        "best_epoch": metrics["best_epoch"],
        "test_from_training": metrics["test"],
        "done": True,
    }
