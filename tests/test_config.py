"""Config overrides and round trips."""

from __future__ import annotations

import pytest

from retrieval.training.config import Config, apply_overrides


def test_overrides_are_typed() -> None:
    c = apply_overrides(
        Config(),
        [
            "train.epochs=3",
            "train.learning_rate=0.01",
            "model.num_interests=none",
            "train.remove_accidental_hits=false",
        ],
    )
    assert (c.train.epochs, c.train.learning_rate, c.model.num_interests) == (3, 0.01, None)
    assert c.train.remove_accidental_hits is False
    assert apply_overrides(c, ["model.num_interests=2"]).model.num_interests == 2


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epochs", "section.field=value"),
        ("nope.x=1", "unknown config section"),
        ("train.nope=1", "unknown field 'train.nope'"),
        ("train.epochs=three", "expected int"),
        ("train.remove_accidental_hits=maybe", "expected true/false"),
    ],
)
def test_bad_overrides_are_explained(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_overrides(Config(), [override])


def test_save_and_load_round_trip(tmp_path) -> None:
    c = apply_overrides(Config(), ["model.tower=sasrec", "data.path=x"])
    c.save(tmp_path / "c.json")
    import json

    assert Config.from_dict(json.loads((tmp_path / "c.json").read_text())) == c
