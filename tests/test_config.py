"""One configuration mechanism (``retrieval.config``) for every config dataclass: typed overrides,
``Literal`` options checked when a config is built, config files, and the tools' ``--config``,
``--print-config`` and fail-fast checks."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from retrieval.config import (
    apply_overrides,
    check_fields,
    config_from_dict,
    config_to_dict,
    field_types,
    literal_values,
    load_config_file,
    update_config,
)
from retrieval.ranking.config import RankerConfig
from retrieval.training.config import (
    DATA_FORMATS,
    FUSIONS,
    LOSSES,
    TRAINING_PROTOCOLS,
    Config,
    DataConfig,
    ModelConfig,
    TrainConfig,
)
from tests.helpers import REPO_ROOT, run_tool


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
    assert apply_overrides(c, ["train.objective=cloze", "train.objective=null"]).train.objective is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epochs", "section.field=value"),
        ("nope.x=1", "unknown config section"),
        ("train.nope=1", "unknown field 'train.nope'"),
        ("train.epochs=three", "expected int"),
        ("train.remove_accidental_hits=maybe", "expected true/false"),
        ("train=1", "'train' is a section"),
        ("train.epochs.x=1", "train.epochs has no fields"),
        (
            "train.loss=none",
            "train.loss: unknown loss 'none'; expected one of sampled_softmax",
        ),  # not optional
    ],
)
def test_bad_overrides_are_explained(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_overrides(Config(), [override])


def test_save_and_load_round_trip(tmp_path) -> None:
    c = apply_overrides(Config(), ["model.tower=sasrec", "data.path=x"])
    c.save(tmp_path / "c.json")
    assert Config.from_dict(json.loads((tmp_path / "c.json").read_text())) == c


# --- Literal options, checked when a config is built ------------------------------------------------

OPTIONS = {
    DataConfig: {"format", "protocol", "timestamp_unit"},
    ModelConfig: {"tower", "fusion", "similarity"},
    TrainConfig: {"objective", "loss", "sampler", "interest_selection", "lr_schedule", "lr_scaling"},
    RankerConfig: {"item_init", "unclicked", "retrieval_fit"},
}
"""Every option with a fixed set of values, per config."""


def options() -> list[tuple[type, str]]:
    return [(cls, name) for cls, names in OPTIONS.items() for name in sorted(names)]


def test_every_option_with_fixed_values_is_a_literal() -> None:
    for cls, names in OPTIONS.items():
        literal = {name for name, hint in field_types(cls).items() if literal_values(hint) is not None}
        assert literal == names, cls.__name__


@pytest.mark.parametrize(("cls", "name"), options(), ids=lambda v: getattr(v, "__name__", v))
def test_a_bad_option_value_is_refused_when_the_config_is_built(cls: type, name: str) -> None:
    values = literal_values(field_types(cls)[name])
    assert values
    for value in values:  # every valid value builds
        assert getattr(cls(**{name: value}), name) == value
    what = name.replace("_", " ")
    message = rf"{cls.__name__}\.{name}: unknown {what} 'foo'; expected one of {', '.join(values)}$"
    with pytest.raises(ValueError, match=message):
        cls(**{name: "foo"})
    with pytest.raises(ValueError, match="expected one of"):
        dataclasses.replace(cls(), **{name: "foo"})


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.loss=foo", f"train.loss: unknown loss 'foo'; expected one of {', '.join(LOSSES)}$"),
        (
            "train.sampler=zipf",
            "train.sampler: unknown sampler 'zipf'; expected one of popularity, uniform, log_uniform",
        ),
        (
            "train.objective=next",
            "train.objective: unknown objective 'next'; expected one of last, all_positions, cloze",
        ),
        (
            "train.interest_selection=soft",
            "unknown interest selection 'soft'; expected one of hard, label_aware, max",
        ),
        (
            "train.lr_schedule=step",
            "unknown lr schedule 'step'; expected one of constant, cosine, linear, plateau",
        ),
        ("train.lr_scaling=cube", "expected one of none, linear, sqrt"),
        (
            "data.protocol=loo-full",
            "data.protocol: unknown protocol 'loo-full'; expected one of loo, loo-refit, comirec",
        ),
        ("data.format=csv", "expected one of movielens, s3rec, sasrec, table, recbole, prepared"),
        (
            "model.fusion=add",
            "model.fusion: unknown fusion 'add'; expected one of none, sum, concat, gated, nova",
        ),
    ],
)
def test_a_bad_option_override_names_the_valid_values(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_overrides(Config(), [override])


def test_the_option_tuples_are_the_literals_values() -> None:
    from retrieval.data.loaders import FORMATS
    from retrieval.data.splits import PROTOCOLS
    from retrieval.training.distribute import LR_SCALINGS, STRATEGIES
    from retrieval.training.examples import OBJECTIVES
    from retrieval.training.losses.samplers import SAMPLERS
    from retrieval.training.losses.task import INTEREST_SELECTIONS
    from retrieval.training.losses.task import LOSSES as TASK_LOSSES
    from retrieval.training.protocols import TRAINING_PROTOCOLS as VALIDATION_PROTOCOLS
    from retrieval.training.schedules import LR_SCHEDULES
    from towers.side import FUSIONS as TOWER_FUSIONS

    types = field_types(TrainConfig)
    assert TASK_LOSSES == LOSSES == literal_values(types["loss"])
    assert literal_values(types["sampler"]) == SAMPLERS
    assert literal_values(types["interest_selection"]) == INTEREST_SELECTIONS
    assert literal_values(types["objective"]) == OBJECTIVES
    assert literal_values(types["lr_schedule"]) == LR_SCHEDULES
    assert literal_values(types["lr_scaling"]) == LR_SCALINGS
    assert STRATEGIES == ("default", "mirrored", "multi-worker")
    assert VALIDATION_PROTOCOLS == TRAINING_PROTOCOLS == literal_values(field_types(DataConfig)["protocol"])
    assert (*FORMATS, "prepared") == DATA_FORMATS
    # towers/ imports nothing from retrieval, so it keeps its own tuple: the two must agree.
    assert TOWER_FUSIONS == FUSIONS == literal_values(field_types(ModelConfig)["fusion"])
    # One vocabulary of protocol names: a training run is scored as the evaluation protocol of its name.
    assert PROTOCOLS == ("loo", "loo-sampled", "comirec")
    assert set(TRAINING_PROTOCOLS) - set(PROTOCOLS) == {"loo-refit"}


# --- nested sections, dict fields, mappings ---------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    mode: Literal["a", "b"] = "a"
    rate: float = 0.5
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Middle:
    leaf: Leaf = field(default_factory=Leaf)
    size: int | None = 3


@dataclass(frozen=True)
class Outer:
    middle: Middle = field(default_factory=Middle)
    name: str = "x"


def test_overrides_reach_any_depth_and_dict_entries() -> None:
    c = apply_overrides(
        Outer(),
        [
            "middle.leaf.mode=b",
            "middle.leaf.rate=2",
            "middle.size=null",
            "middle.leaf.extra.units=[64, 32]",
            "middle.leaf.extra.activation=relu",  # not JSON: the text
            "middle.leaf.extra.nested.key=0.5",  # the rest of the key names the entry
            "name=y",
        ],
    )
    assert c == Outer(
        Middle(Leaf("b", 2.0, {"units": [64, 32], "activation": "relu", "nested.key": 0.5}), None), "y"
    )
    assert apply_overrides(c, ['middle.leaf.extra={"a": 1}']).middle.leaf.extra == {"a": 1}  # the whole dict
    with pytest.raises(ValueError, match=r"middle.leaf.mode: unknown mode 'c'; expected one of a, b"):
        apply_overrides(Outer(), ["middle.leaf.mode=c"])
    with pytest.raises(
        ValueError, match=r"unknown field 'middle.leaf.nope'; middle.leaf has \['extra', 'mode'"
    ):
        apply_overrides(Outer(), ["middle.leaf.nope=1"])
    with pytest.raises(ValueError, match=r"middle.leaf.extra: expected a JSON object"):
        apply_overrides(Outer(), ["middle.leaf.extra=[1]"])


def test_ranker_overrides_set_fields_and_options() -> None:
    c = apply_overrides(
        RankerConfig(), ["epochs=3", "options.hidden_units=[64, 32]", "options.retrieval_score=false"]
    )
    assert (c.epochs, c.options) == (3, {"hidden_units": [64, 32], "retrieval_score": False})
    with pytest.raises(
        ValueError, match=r"unknown ranker setting 'nope' in 'nope=1'; choose from .*options\.NAME"
    ):
        apply_overrides(RankerConfig(), ["nope=1"])
    with pytest.raises(ValueError, match="not of the form field=value"):
        apply_overrides(RankerConfig(), ["epochs"])
    with pytest.raises(
        ValueError, match=r"RankerConfig.item_init: unknown item init 'x'; expected one of retriever, random"
    ):
        RankerConfig(item_init="x")  # type: ignore[arg-type]


def test_mappings_update_what_they_name_and_refuse_unknown_keys() -> None:
    c = update_config(Config(), {"train": {"epochs": 3, "learning_rate": 1}, "data": {"format": None}})
    assert (c.train.epochs, c.train.learning_rate, c.model) == (3, 1.0, ModelConfig())
    assert isinstance(c.train.learning_rate, float)
    assert config_from_dict(Config, config_to_dict(c)) == c
    with pytest.raises(ValueError, match=r"unknown key\(s\) train.nope in train; valid: batch_size, "):
        update_config(Config(), {"train": {"nope": 1}})
    with pytest.raises(ValueError, match=r"unknown key\(s\) trian in config; valid: data, model, train"):
        config_from_dict(Config, {"trian": {}})
    with pytest.raises(ValueError, match=r"train.epochs: expected int, got 'three'"):
        update_config(Config(), {"train": {"epochs": "three"}})
    with pytest.raises(ValueError, match=r"train.epochs: expected int, got True"):
        update_config(Config(), {"train": {"epochs": True}})
    with pytest.raises(ValueError, match=r"train.loss: unknown loss 'foo'; expected one of "):
        update_config(Config(), {"train": {"loss": "foo"}})
    with pytest.raises(ValueError, match="train: expected a mapping of fields"):
        update_config(Config(), {"train": 3})
    with pytest.raises(ValueError, match=r"model.tower: expected .*, got null"):
        update_config(Config(), {"model": {"tower": None}})


# --- config files -----------------------------------------------------------------------------------


def test_yaml_and_json_files_give_the_same_config(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text(
        "# a partial configuration: the rest keeps its defaults\n"
        "data:\n  path: log.csv\n  protocol: comirec\n"
        "model:\n  tower: sasrec\n  num_interests: null\n"
        "train:\n  learning_rate: 3e-3  # YAML reads this as text\n  logq_correction: false\n"
    )
    payload = {
        "data": {"path": "log.csv", "protocol": "comirec"},
        "model": {"tower": "sasrec", "num_interests": None},
        "train": {"learning_rate": 0.003, "logq_correction": False},
    }
    (tmp_path / "run.json").write_text(json.dumps(payload))
    (tmp_path / "run.yml").write_text("")
    from_yaml = update_config(Config(), load_config_file(tmp_path / "run.yaml"))
    assert from_yaml == update_config(Config(), load_config_file(tmp_path / "run.json"))
    assert (from_yaml.data.protocol, from_yaml.train.learning_rate, from_yaml.train.logq_correction) == (
        "comirec",
        0.003,
        False,
    )
    assert from_yaml.train.epochs == TrainConfig().epochs  # left out: the default
    assert load_config_file(tmp_path / "run.yml") == {}


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("a.toml", "x = 1", "a config file is .json, .yaml, .yml"),
        ("a.yaml", "train: [1, 2", "not valid YAML"),
        ("a.json", "{train: 1}", "not valid JSON"),
        ("a.yaml", "- 1\n- 2\n", "expected a mapping of sections and fields, got list"),
        ("missing.yaml", None, "cannot read config file"),
    ],
)
def test_bad_config_files_are_explained(tmp_path: Path, name: str, text: str | None, message: str) -> None:
    if text is not None:
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config_file(tmp_path / name)


# --- the tools: nothing heavy before the configuration is checked -------------------------------------


def loaded_after(code: str) -> tuple[list[str], str]:
    """Which of TensorFlow and Keras a fresh interpreter loaded after ``code``, and what it printed."""
    script = f"import sys\n{code}\nprint(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    )
    *printed, last = done.stdout.strip().splitlines()
    return list(ast.literal_eval(last)), "\n".join(printed)


def test_the_configuration_loads_no_tensorflow() -> None:
    loaded, _ = loaded_after(
        "import retrieval.config, retrieval.training.config, retrieval.training.presets\n"
        "import retrieval.ranking.config\n"
        "from retrieval.config import apply_overrides, update_config\n"
        "from retrieval.training import Config, apply_preset, LOSSES, STRATEGIES, TOWERS\n"
        "from retrieval.ranking import RankerConfig, ITEM_INITS"
    )
    assert loaded == []


@pytest.mark.parametrize("tool", ["train", "train_ranker"])
def test_a_bad_value_fails_before_tensorflow_is_loaded(tool: str, tmp_path: Path) -> None:
    """The tool's main in a fresh interpreter: exit 2, and TensorFlow never imported."""
    setting = "train.loss=foo" if tool == "train" else "retrieval_fit=foo"
    args = ["--data", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "out"), "--set", setting]
    if tool == "train_ranker":
        args += ["--model", str(tmp_path / "m"), "--index", str(tmp_path / "i"), "--ranker", "din"]
    loaded, printed = loaded_after(
        "import contextlib, importlib.util, io\n"
        f"spec = importlib.util.spec_from_file_location('tool', 'tools/{tool}.py')\n"
        "tool = importlib.util.module_from_spec(spec); spec.loader.exec_module(tool)\n"
        "err = io.StringIO()\n"
        f"with contextlib.redirect_stderr(err): code = tool.main({args!r})\n"
        "print(code, err.getvalue().strip())"
    )
    assert loaded == []
    assert printed.startswith("2 error: ") and "expected one of" in printed


def test_train_refuses_a_bad_loss_before_reading_data() -> None:
    """The command line itself: exit 2 and one line naming the valid losses; --data points nowhere,
    so an error about the data would mean it was read first."""
    done = subprocess.run(
        [sys.executable, "tools/train.py", "--data", "/nonexistent/log.csv", "--out", "/nonexistent/out",
         "--set", "train.loss=foo"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [f"error: train.loss: unknown loss 'foo'; expected one of {', '.join(LOSSES)}"]
    assert done.stdout == ""


def test_unknown_keys_fail_in_the_tools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_tool("train", "--data", "x.csv", "--out", "x", "--set", "train.nope=1") == 2
    assert "unknown field 'train.nope'" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("train:\n  epoch: 3\n")
    assert run_tool("train", "--data", "x.csv", "--out", "x", "--config", str(tmp_path / "bad.yaml")) == 2
    assert "unknown key(s) train.epoch in train; valid: " in capsys.readouterr().err
    assert run_tool("train_ranker", "--print-config", "--set", "ranker_name=din") == 2
    assert "unknown ranker setting 'ranker_name'" in capsys.readouterr().err


def printed_config(capsys: pytest.CaptureFixture[str], tool: str, *args: str) -> dict[str, Any]:
    assert run_tool(tool, "--print-config", *args) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_print_config_layers_defaults_preset_file_flags_then_set(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run.yaml").write_text(
        "model:\n  dim: 16\n  dropout: 0.1\ntrain:\n  epochs: 5\n  loss: mixed\n"
    )
    printed = printed_config(
        capsys, "train", "--preset", "beauty-sasrec", "--data-root", str(shared_data),
        "--config", str(tmp_path / "run.yaml"), "--epochs", "7", "--set", "model.dropout=0.3",
    )  # fmt: skip
    config = config_from_dict(Config, printed)
    assert config.data.path == str(shared_data / "amazon-beauty" / "Beauty.txt")  # the preset's dataset
    assert (config.train.num_negatives, config.train.sampler) == (4096, "uniform")  # the preset
    assert (config.model.dim, config.train.loss) == (16, "mixed")  # the file
    assert config.train.epochs == 7  # the flag over the file
    assert config.model.dropout == 0.3  # --set last
    # Printed back as --config, the same configuration; nothing is read (the data is not there).
    (tmp_path / "printed.json").write_text(json.dumps(printed))
    assert printed_config(capsys, "train", "--config", str(tmp_path / "printed.json")) == printed
    assert printed_config(capsys, "train", "--data", "/nonexistent.csv")["data"]["path"] == "/nonexistent.csv"


def test_a_preset_needs_a_data_root_unless_the_data_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from retrieval.data import DATA_ROOT_ENV

    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    assert run_tool("train", "--preset", "beauty-sasrec", "--out", "x") == 2
    assert "no data root: pass --data-root DIR or set MITT_DATA" in capsys.readouterr().err
    assert (
        printed_config(capsys, "train", "--preset", "beauty-sasrec", "--data", "log.csv")["data"]["path"]
        == "log.csv"
    )
    (tmp_path / "amazon-beauty").mkdir()
    (tmp_path / "amazon-beauty" / "Beauty.txt").touch()
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path))
    printed = printed_config(capsys, "train", "--preset", "beauty-sasrec")
    assert printed["data"]["path"] == str(tmp_path / "amazon-beauty" / "Beauty.txt")


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_a_trained_models_config_json_repeats_its_run(
    synthetic_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Train tiny, give the artifact's config.json back as --config: --print-config prints it as saved."""
    out = tmp_path / "model"
    args = ["--data", str(synthetic_csv), "--out", str(out), "--model", "youtubednn", "--dim", "8"]
    args += ["--max-len", "6", "--epochs", "1", "--negatives", "5", "--set", "train.batch_size=64"]
    args += ["--set", "train.lr_schedule=cosine", "--set", "train.learning_rate=0.002", "--quiet"]
    assert run_tool("train", *args) == 0
    capsys.readouterr()
    saved = (out / "config.json").read_text()
    assert run_tool("train", "--print-config", "--config", str(out / "config.json")) == 0
    assert capsys.readouterr().out.strip() == saved.strip()  # the same text, not only the same values
    assert run_tool("train", "--print-config", *args[:-1]) == 0  # the command line that trained it
    assert json.loads(capsys.readouterr().out) == json.loads(saved)


def test_train_ranker_takes_a_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ranker.yaml").write_text(
        "ranker: dstn\nepochs: 4\nnegatives: retrieved+uniform\noptions:\n  hidden_units: [8]\n"
    )
    printed = printed_config(
        capsys, "train_ranker", "--config", str(tmp_path / "ranker.yaml"), "--epochs", "3",
        "--set", "options.attention_units=4",
    )  # fmt: skip
    expected = apply_overrides(
        RankerConfig(), ["ranker=dstn", "negatives=retrieved+uniform", "options.hidden_units=[8]", "epochs=3"]
    )
    expected = apply_overrides(expected, ["options.attention_units=4"])
    assert printed == config_to_dict(expected)
    (tmp_path / "printed.json").write_text(json.dumps(printed))
    assert printed_config(capsys, "train_ranker", "--config", str(tmp_path / "printed.json")) == printed
    (tmp_path / "bad.yaml").write_text("item_init: zeros\n")
    assert run_tool("train_ranker", "--print-config", "--config", str(tmp_path / "bad.yaml")) == 2
    assert (
        "item_init: unknown item init 'zeros'; expected one of retriever, random" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):  # training needs the folders and a ranker (a --config may name it)
        run_tool("train_ranker", "--data", "x.csv", "--out", "x")


def test_a_config_saved_before_settings_were_removed_still_loads_at_their_old_defaults() -> None:
    """``config.json`` files written before ``model.block``, ``model.ffn_multiplier`` and the
    contrastive regulariser were removed hold them at their defaults: they load as today's
    default config; a file that set one to anything else is refused by its key."""
    saved = Config().to_dict()
    saved["model"] |= {"block": "pre_ln", "ffn_multiplier": 1}
    saved["train"] |= {"contrastive_weight": 0.0, "contrastive_temperature": 1.0}
    assert Config.from_dict(json.loads(json.dumps(saved))) == Config()
    for section, key, value in [
        ("model", "block", "ligr"),
        ("model", "ffn_multiplier", 4),
        ("train", "contrastive_weight", 0.1),
    ]:
        changed = json.loads(json.dumps(saved))
        changed[section][key] = value
        with pytest.raises(ValueError, match=rf"^{section}\.{key}={value!r}: this setting was removed"):
            Config.from_dict(changed)
