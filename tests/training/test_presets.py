"""Named presets and how tools/train.py layers them under its flags and --set."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

from retrieval.config import apply_overrides
from retrieval.data import DATA_ROOT_ENV, DATASETS, DataError, dataset_at
from retrieval.training.config import Config, ModelConfig, TrainConfig
from retrieval.training.presets import PRESETS, TOWERS, apply_preset, get_preset, preset_for, preset_names
from tests.helpers import REPO_ROOT
from towers import tower_names


def train_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tools_train", REPO_ROOT / "tools" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_preset_per_dataset_and_tower(shared_data: Path) -> None:
    assert sorted(TOWERS) == tower_names()
    assert preset_names() == sorted([*TOWERS, *(f"{d}-{t}" for d in DATASETS for t in TOWERS)])
    for name, preset in PRESETS.items():
        config = apply_preset(Config(), name, data_root=shared_data)  # every override is a valid, typed field
        assert config.model.tower == name.split("-", 1)[-1]
        assert config.data.path == ("" if preset.dataset is None else str(preset.dataset_path(shared_data)))
        assert preset.tuned or "not tuned" in preset.note
        # Every preset budgets in steps and stops on a plateau: none falls back to epochs.
        assert config.train.epochs is None and config.train.patience > 0, name
        assert not any(o.startswith(("train.epochs=", "train.eval_every=")) for o in preset.overrides), name


def test_a_preset_for_any_data_names_no_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--preset sasrec`` names no dataset: the data comes from --data (no data root needed)."""
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    assert apply_preset(Config(), "sa") == Config(model=ModelConfig(tower="sa"))  # the defaults
    assert apply_preset(Config(), "din").train.patience == 2  # DIN overfits early on any data
    with pytest.raises(ValueError, match="names no dataset"):
        get_preset("sa").dataset_path(tmp_path)
    config, _ = train_tool().parse_args(["--preset", "sasrec", "--data", "mine.csv", "--out", "x"])
    assert config == apply_overrides(apply_preset(Config(), "sasrec"), ["data.path=mine.csv"])
    assert train_tool().main(["--preset", "sasrec", "--out", "x"]) == 2  # no data


def test_sasrec_on_any_data_is_beauty_sasrec_without_its_schedule(shared_data: Path) -> None:
    """The Beauty preset's values, but a decay on the plateau and the default step budget: a
    decay's horizon would be one dataset's number of steps."""
    anywhere = apply_preset(Config(), "sasrec")
    beauty = apply_preset(Config(), "beauty-sasrec", data_root=shared_data)
    assert anywhere.model == beauty.model
    schedule = {"max_steps", "eval_every_steps", "lr_schedule"}
    differ = {
        f.name
        for f in dataclasses.fields(TrainConfig)
        if getattr(anywhere.train, f.name) != getattr(beauty.train, f.name)
    }
    assert differ == schedule
    assert (anywhere.train.lr_schedule, anywhere.train.max_steps) == ("plateau", TrainConfig().max_steps)
    assert apply_preset(Config(), "ml100k-sasrec", data_root=shared_data).train == anywhere.train


def test_without_a_preset_the_tower_s_own_applies() -> None:
    """``mitt train --model din`` is ``--preset din``: the tower named by any layer (a flag,
    ``--set``, a config file) picks it, and every later layer still overrides it."""
    assert preset_for(None, "din") == preset_for("nowhere", "din") == "din"
    assert preset_for("beauty", "sasrec") == "beauty-sasrec"
    with pytest.raises(ValueError, match="unknown preset 'gru'"):
        preset_for(None, "gru")
    tool = train_tool()
    for argv in (["--model", "din"], ["--set", "model.tower=din"]):
        config, _ = tool.parse_args(["--data", "x.csv", "--out", "x", *argv])
        assert config == apply_overrides(apply_preset(Config(), "din"), ["data.path=x.csv"])
    config, _ = tool.parse_args(
        ["--data", "x.csv", "--out", "x", "--model", "din", "--set", "train.patience=7"]
    )
    assert config.train.patience == 7 and apply_preset(Config(), "din").train.patience == 2


def test_beauty_sasrec_keeps_its_tuned_budget_in_steps() -> None:
    """Tuned as 39 epochs validated every 3 on Beauty, 88 steps each: now a step budget, which
    on Beauty is the same run (within a round) and on smaller data does not end after 200 steps."""
    train = apply_overrides(Config(), get_preset("beauty-sasrec").overrides).train
    budget = train.budget(88)
    assert abs(budget.steps - 39 * 88) < budget.round_steps and abs(budget.round_steps - 3 * 88) < 20
    assert budget.schedule_steps == budget.steps and train.lr_schedule == "cosine"
    assert train.budget(6).steps == budget.steps  # a 1,000-user subset: 6 steps per epoch


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown preset 'beauty-gru'.*beauty-sasrec.*ml100k-sa"):
        get_preset("beauty-gru")


def test_preset_then_flags_then_set(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_ROOT_ENV, str(shared_data))
    tool = train_tool()
    config, _ = tool.parse_args(
        [
            "--preset",
            "beauty-sasrec",
            "--out",
            "x",
            "--max-steps",
            "300",
            "--loss",
            "gbce",
            "--set",
            "train.max_steps=400",
        ]
    )
    assert (config.model.tower, config.train.loss, config.train.max_steps) == ("sasrec", "gbce", 400)
    assert config.data.path.endswith("Beauty.txt")
    config, _ = tool.parse_args(
        ["--preset", "ml100k-sa", "--out", "x", "--data", "log.csv", "--model", "din"]
    )
    assert (config.data.path, config.model.tower) == ("log.csv", "din")
    # Flags left out keep the preset's (here: the defaults') values.
    assert config == apply_overrides(
        apply_preset(Config(), "ml100k-sa", data_root=shared_data), ["data.path=log.csv", "model.tower=din"]
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


def test_a_preset_finds_its_dataset_under_the_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "amazon-beauty").mkdir()
    (tmp_path / "amazon-beauty" / "Beauty.txt").touch()
    assert apply_preset(Config(), "beauty-sasrec", tmp_path).data.path == str(tmp_path / DATASETS["beauty"])
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path))  # no root given: $MITT_DATA
    assert apply_preset(Config(), "beauty-sasrec").data.path == str(tmp_path / DATASETS["beauty"])
    with pytest.raises(DataError, match="dataset 'ml100k' not found"):
        apply_preset(Config(), "ml100k-sa")
    monkeypatch.delenv(DATA_ROOT_ENV)
    with pytest.raises(DataError, match=f"no data root: pass --data-root DIR or set {DATA_ROOT_ENV}"):
        apply_preset(Config(), "beauty-sasrec")


def test_dataset_at_names_only_the_default_locations(tmp_path: Path, shared_data: Path) -> None:
    for name, rel in DATASETS.items():
        assert dataset_at(shared_data / rel, shared_data) == name
        assert dataset_at(os.path.relpath(shared_data / rel), shared_data) == name
    assert dataset_at(tmp_path / "Beauty.txt", shared_data) is None


def test_a_borrowed_preset_takes_the_tuned_values_but_its_own_data(shared_data: Path) -> None:
    sports = apply_preset(Config(), "sports-sasrec", data_root=shared_data)
    beauty = apply_preset(Config(), "beauty-sasrec", data_root=shared_data)
    assert sports.model == beauty.model
    assert sports.train == dataclasses.replace(beauty.train, loss="full_softmax")  # Sports' own choice
    assert sports.data.path.endswith("Sports_and_Outdoors.txt")
    assert not get_preset("sports-sasrec").tuned and "beauty-sasrec" in get_preset("sports-sasrec").note
