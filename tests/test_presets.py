"""Named presets and how tools/train.py layers them under its flags and --set."""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import pytest

from retrieval.training.config import Config, apply_overrides
from retrieval.training.presets import DATASETS, PRESETS, TOWERS, apply_preset, get_preset, preset_names
from tests.conftest import REPO_ROOT
from towers import tower_names


def train_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tools_train", REPO_ROOT / "tools" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_preset_per_dataset_and_tower() -> None:
    assert sorted(TOWERS) == tower_names()
    assert preset_names() == sorted(f"{d}-{t}" for d in DATASETS for t in TOWERS)
    for name, preset in PRESETS.items():
        config = apply_preset(Config(), name)  # every override is a valid, typed field
        assert config.model.tower == name.split("-", 1)[1]
        assert config.data.path == str(preset.data_path)
        assert preset.tuned or "not tuned" in preset.note


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown preset 'beauty-gru'.*beauty-sasrec.*ml100k-sa"):
        get_preset("beauty-gru")


def test_preset_then_flags_then_set() -> None:
    tool = train_tool()
    config, _ = tool.parse_args(
        [
            "--preset",
            "beauty-sasrec",
            "--out",
            "x",
            "--epochs",
            "3",
            "--loss",
            "gbce",
            "--set",
            "train.epochs=4",
        ]
    )
    assert (config.model.tower, config.train.loss, config.train.epochs) == ("sasrec", "gbce", 4)
    assert config.data.path.endswith("Beauty.txt")
    config, _ = tool.parse_args(
        ["--preset", "ml100k-sa", "--out", "x", "--data", "log.csv", "--model", "din"]
    )
    assert (config.data.path, config.model.tower) == ("log.csv", "din")
    # Flags left out keep the preset's (here: the defaults') values.
    assert config == apply_overrides(
        apply_preset(Config(), "ml100k-sa"), ["data.path=log.csv", "model.tower=din"]
    )


def test_cli_errors_are_reported(capsys) -> None:
    tool = train_tool()
    assert tool.main(["--preset", "nope", "--out", "x"]) == 2
    assert "unknown preset 'nope'; choose one of: beauty-bert4rec" in capsys.readouterr().err
    assert tool.main(["--out", "x"]) == 2
    assert "no data" in capsys.readouterr().err
    assert tool.main(["--data", "x.csv", "--out", "x", "--set", "train.loss_name=bce"]) == 2
    config, _ = tool.parse_args(["--data", "x.csv", "--out", "x", "--set", "train.loss=mixed"])
    assert config.train.loss == "mixed"


def test_dataset_at_names_only_the_default_locations(tmp_path) -> None:
    from retrieval.training.presets import DATASETS, SHARED_DATA, dataset_at

    for name, rel in DATASETS.items():
        assert dataset_at(SHARED_DATA / rel) == name
        assert dataset_at(os.path.relpath(SHARED_DATA / rel)) == name
    assert dataset_at(tmp_path / "Beauty.txt") is None


def test_a_borrowed_preset_takes_the_tuned_values_but_its_own_data() -> None:
    sports, beauty = apply_preset(Config(), "sports-sasrec"), apply_preset(Config(), "beauty-sasrec")
    assert (sports.model, sports.train) == (beauty.model, beauty.train)
    assert sports.data.path.endswith("Sports_and_Outdoors.txt")
    assert not get_preset("sports-sasrec").tuned and "beauty-sasrec" in get_preset("sports-sasrec").note
