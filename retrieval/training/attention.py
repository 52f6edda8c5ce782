"""Interpretability: a trained tower's attention maps over one user's history, drawn as heatmaps.

Example:
    >>> maps = plot_user_attention(Path("runs/ml100k-sa"), "data/ml-100k", "1", Path("u1.png"))
    >>> maps["interests"].shape  # [K, history length]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.artifacts.model import data_options
from retrieval.data.interactions import build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.vocab import ItemVocab


def user_history(
    data_path: str | Path,
    user: str,
    vocab: ItemVocab,
    data_format: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """The user's whole sequence in ``data_path``, oldest first, as dense ids of the model's ``vocab``.

    Items the model does not know are dropped (the tower could not embed them). ``options``: the
    table's column mapping and timestamp unit (:func:`~retrieval.artifacts.model.data_options`).

    Raises:
        ValueError: the user is not in the data, or none of their items is in the vocabulary.
    """
    data = build_sequences(load_interactions(data_path, data_format, **(options or {})))
    if user not in data.users:
        raise ValueError(f"user {user!r} is not in {data_path}")
    sequence = data.sequences[data.users.index(user)]
    dense = vocab.lookup(data.vocab.external(sequence))
    if not (dense > 0).any():
        raise ValueError(f"none of user {user!r}'s items is in the model's vocabulary")
    return dense[dense > 0]


def attention_for_history(model: Any, history: np.ndarray) -> dict[str, np.ndarray]:
    """The user tower's attention maps for one history (cut to the tower's ``max_len``).

    Args:
        model: a :class:`retrieval.training.model.TwoTowerModel`.
        history: dense ids ``[n]``, oldest first.

    Returns:
        name -> float32 ``[rows, n']`` over the last ``n' = min(n, max_len)`` items.

    Raises:
        ValueError: the tower has no attention maps.
    """
    tower = model.user_tower
    items = np.asarray(history, np.int32)[-tower.max_len :][None, :]  # [1, n'], no padding needed
    maps = {name: np.asarray(value)[0] for name, value in tower.attention_maps({"items": items}).items()}
    if not maps:
        raise ValueError(f"tower {type(tower).__name__} has no attention maps to draw")
    return maps


def plot_attention_maps(
    maps: dict[str, np.ndarray], labels: Sequence[str], out: Path, title: str = ""
) -> None:
    """Draws each ``[rows, n]`` map as a heatmap (rows = interests or heads, columns = ``labels``).

    Non-negative maps use a sequential colour scale from 0; maps with negative entries (DIN's
    un-normalised weights) a diverging one centred on 0. Written with matplotlib's Agg canvas,
    so no display and no global pyplot state are involved.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width = max(6.0, 0.32 * len(labels) + 2.5)
    heights = [max(1.2, 0.45 * m.shape[0] + 0.8) for m in maps.values()]
    fig = Figure(figsize=(width, sum(heights) + 2.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(maps), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, (name, values) in zip(axes, maps.items(), strict=True):
        if values.min() < 0:
            bound = float(np.abs(values).max()) or 1.0
            image = ax.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-bound, vmax=bound)
        else:
            image = ax.imshow(values, aspect="auto", cmap="viridis", vmin=0.0)
        ax.set_ylabel(name)
        ax.set_yticks(range(values.shape[0]))
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels([], rotation=90)
        fig.colorbar(image, ax=ax, pad=0.01)
    # Item labels under the last map only: every map shares the same columns.
    axes[-1].set_xticklabels([label[:40] for label in labels], rotation=90, fontsize=7)
    axes[-1].set_xlabel("history, oldest → newest")
    if title:
        fig.suptitle(title)
    fig.savefig(out, dpi=110)


def plot_user_attention(
    model_dir: Path, data_path: str | Path, user: str, out: Path, data_format: str | None = None
) -> dict[str, np.ndarray]:
    """Loads ``model_dir/model.keras``, takes ``user``'s history from the data, writes the heatmaps.

    Returns:
        the maps drawn, name -> ``[rows, n]``.
    """
    import keras

    import retrieval.training.model  # noqa: F401  (registers the model and tower classes for loading)

    model_dir = Path(model_dir)
    model = keras.saving.load_model(model_dir / "model.keras")
    vocab = ItemVocab.load(model_dir / "vocab.json")
    history = user_history(data_path, user, vocab, data_format, data_options(model_dir))
    maps = attention_for_history(model, history)
    shown = history[-next(iter(maps.values())).shape[1] :]
    tower = type(model.user_tower).__name__
    plot_attention_maps(maps, [vocab.title(int(i)) for i in shown], Path(out), f"user {user} — {tower}")
    return maps
