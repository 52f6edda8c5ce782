"""What the benchmark runs: the models of each side under each protocol, the pairs compared one to
one, and the settings that fix a run's numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelRun:
    """One model of one side under one protocol.

    Attributes:
        side: ``ours``, ``recbole`` or ``deepmatch``.
        model: our tower name, or the peer's model name.
        protocol: ``loo`` or ``comirec``.
    """

    side: str
    model: str
    protocol: str

    @property
    def name(self) -> str:
        return f"{self.side}-{self.model}"


PAIRS = (
    ("loo", "sasrec", "recbole", "SASRec"),
    ("loo", "bert4rec", "recbole", "BERT4Rec"),
    ("comirec", "sa", "deepmatch", "ComiRec-SA"),
    ("comirec", "dr", "deepmatch", "ComiRec-DR"),
    ("comirec", "mind", "deepmatch", "MIND"),
    ("comirec", "youtubednn", "deepmatch", "YouTubeDNN"),
)
"""(protocol, our tower, peer, peer model): the counterparts compared one to one."""


def model_runs(
    peers: Sequence[str], protocols: Sequence[str], models: Sequence[str] | None, multi_interest: str
) -> list[ModelRun]:
    """Every run to do: for each protocol our towers, then the peers' models.

    ``loo`` adds ``multi_interest`` (our best multi-interest tower) to our ``sasrec`` and
    ``bert4rec``; ``models`` (names of either side) keeps only those.
    """
    runs: list[ModelRun] = []
    for protocol in protocols:
        ours = [t for p, t, _, _ in PAIRS if p == protocol]
        if protocol == "loo" and multi_interest not in ours:
            ours.append(multi_interest)
        runs += [ModelRun("ours", t, protocol) for t in ours]
        runs += [ModelRun(peer, m, protocol) for p, _, peer, m in PAIRS if p == protocol and peer in peers]
    if models:
        runs = [r for r in runs if r.model in models]
    return runs


@dataclass(frozen=True)
class Settings:
    """What fixes a run's numbers: a finished run is reused only when these are equal."""

    data: str
    max_users: int
    epochs: int | None
    """Every side's epoch budget; ``None``: per pair, our tower's (:func:`run_settings`)."""
    batch_size: int
    dim: int
    max_len: int
    seed: int
    interests: int
    negatives: int
    peer_minutes: float
    overrides: tuple[str, ...] = ()
    presets: bool = True
    """Whether our towers start from their preset for ``data`` (when it is a preset dataset)."""
