"""Settings that cannot be right are refused when the configuration is built: every numeric field
of every config has a range declared beside it, and a value outside it (or outside a choice
field's values) fails before anything heavy is loaded, naming the flag or key it was given
with, the value and the range (issue 43, item 13)."""

from __future__ import annotations

import ast
import functools
import importlib
import itertools
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from retrieval.artifacts.index_config import IndexConfig, MilvusConfig
from retrieval.config import apply_overrides, field_types, update_config
from retrieval.ranking.config import RankerConfig
from retrieval.training.config import Config, DataConfig, ModelConfig, TrainConfig
from tests.helpers import REPO_ROOT

CONFIGS: dict[type, tuple[type, str]] = {
    DataConfig: (Config, "data."),
    ModelConfig: (Config, "model."),
    TrainConfig: (Config, "train."),
    RankerConfig: (RankerConfig, ""),
    IndexConfig: (IndexConfig, ""),
    MilvusConfig: (IndexConfig, "milvus."),
}
"""Every config dataclass with fields of its own -> the config its overrides apply to, and the
prefix of its keys there."""


def numeric_fields() -> list[tuple[type, str, type]]:
    """(config, field, int or float) for every numeric field, optional or not (bool is not one)."""
    found = []
    for cls in CONFIGS:
        for name, annotation in field_types(cls).items():
            if typing.get_origin(annotation) in (typing.Union, types.UnionType):
                members = [a for a in typing.get_args(annotation) if a is not type(None)]
                annotation = members[0] if len(members) == 1 else None
            if annotation in (int, float):
                found.append((cls, name, annotation))
    return found


def set_field(cls: type, name: str, raw: str) -> tuple[str, Any]:
    """The key of ``cls.name`` and the value it holds once set to ``raw`` by an override."""
    root, prefix = CONFIGS[cls]
    config = apply_overrides(root(), [f"{prefix}{name}={raw}"])
    return prefix + name, functools.reduce(getattr, (prefix + name).split("."), config)


def test_every_numeric_field_refuses_what_no_range_allows() -> None:
    """No field takes a negative number, NaN or an infinity: each is refused, naming its key and value."""
    fields = numeric_fields()
    assert len(fields) > 40, fields  # every config's, not an empty walk
    for cls, name, kind in fields:
        for raw in ["-1", "nan", "inf", "-inf"] if kind is float else ["-1"]:
            key = CONFIGS[cls][1] + name
            shown = raw if kind is int or raw != "-1" else "-1.0"
            with pytest.raises(ValueError, match=rf"^{re.escape(f'{key}={shown}')}: must be "):
                set_field(cls, name, raw)


def test_each_declared_range_is_the_one_enforced_at_both_ends() -> None:
    """Beside every numeric field a range (the defaults within it), enforced at each of its ends,
    open or closed, with a message naming the key, the value and the range."""
    from retrieval.config import Range, field_ranges

    ends = 0
    for cls, name, kind in numeric_fields():
        allowed = field_ranges(cls)[name]
        assert isinstance(allowed, Range), (cls, name)
        default = getattr(cls(), name)
        assert default is None or default in allowed, (cls, name)
        step = 1 if kind is int else 1e-6
        for end, is_open, outward in (
            (allowed.low, allowed.low_open, -step),
            (allowed.high, allowed.high_open, step),
        ):
            if end is None:
                continue
            inside, outside = (end - outward, end) if is_open else (end, end + outward)
            key, value = set_field(cls, name, repr(kind(inside)))
            assert value == kind(inside), key
            shown = f"{key}={kind(outside)!r}: must be {allowed}"
            with pytest.raises(ValueError, match=f"^{re.escape(shown)}$"):
                set_field(cls, name, repr(kind(outside)))
            ends += 1
    assert ends >= len(numeric_fields())  # a lower bound at least on every field


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.learning_rate=-1", "train.learning_rate=-1.0: must be > 0"),
        ("model.dropout=1.5", "model.dropout=1.5: must be in [0, 1)"),
        ("model.dim=0", "model.dim=0: must be >= 1"),
        ("train.batch_size=-5", "train.batch_size=-5: must be >= 1"),
        ("train.seed=-1", "train.seed=-1: must be in [0, 4294967295]"),
        ("train.cooldown_fraction=1", "train.cooldown_fraction=1.0: must be in (0, 1)"),
        ("train.temperature=inf", "train.temperature=inf: must be finite and > 0"),
        ("data.fold=-1", "data.fold=-1: must be >= 0"),
        (
            "model.tower=transformer",
            "model.tower: unknown tower 'transformer'; expected one of youtubednn, sa, dr, mind, din, "
            "sasrec, bert4rec, fmlprec, bsarec",
        ),
    ],
)
def test_an_override_out_of_range_names_its_key_value_and_range(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        apply_overrides(Config(), [override])


def test_a_file_or_a_constructor_out_of_range_is_refused_too() -> None:
    with pytest.raises(ValueError, match=r"^train\.learning_rate=-1\.0: must be > 0$"):
        update_config(Config(), {"train": {"learning_rate": -1}})
    with pytest.raises(ValueError, match=r"^model\.num_interests=0: must be >= 1$"):
        update_config(Config(), {"model": {"num_interests": 0, "dim": 8}})
    assert update_config(Config(), {"model": {"num_interests": None}}).model.num_interests is None
    with pytest.raises(ValueError, match=r"^ModelConfig\.dropout=1\.0: must be in \[0, 1\)$"):
        ModelConfig(dropout=1.0)
    with pytest.raises(ValueError, match=r"^RankerConfig\.candidates=9: must be >= 10$"):
        RankerConfig(candidates=9)  # the reranked list is at least NDCG@10's
    with pytest.raises(ValueError, match=r"^candidates=9: must be >= 10$"):
        apply_overrides(RankerConfig(), ["candidates=9"])


# --- the command lines: the flag as typed, before anything heavy -------------------------------------


REQUIRED = {
    "train": ["--data", "log.csv", "--out", "out"],
    "train_ranker": ["--print-config", "--ranker", "din"],
    "build_index": ["--model", "m", "--out", "o"],
    "evaluate": ["--model", "m", "--data", "d"],
    "prepare": ["--data", "d", "--out", "o"],
}
"""Each command's required arguments, none of whose paths is read by its parser."""


@pytest.mark.parametrize(
    ("module", "flag", "value", "expected"),
    [
        ("train", "--dim", "0", ">= 1"),
        ("train", "--num-interests", "0", ">= 1"),
        ("train", "--max-len", "0", ">= 1"),
        ("train", "--max-steps", "0", ">= 1"),
        ("train", "--epochs", "0", ">= 1"),
        ("train", "--batch-size", "-5", ">= 1"),
        ("train", "--lr", "-1", "> 0"),
        ("train", "--negatives", "0", ">= 1"),
        ("train", "--seed", "-1", "in [0, 4294967295]"),
        ("train_ranker", "--epochs", "0", ">= 1"),
        ("train_ranker", "--num-negatives", "0", ">= 1"),
        ("train_ranker", "--candidates", "5", ">= 10"),
        ("train_ranker", "--positions-per-user", "0", ">= 1"),
        ("train_ranker", "--dim", "-1", ">= 0"),
        ("train_ranker", "--batch-size", "0", ">= 1"),
        ("train_ranker", "--lr", "0", "> 0"),
        ("train_ranker", "--seed", "-3", "in [0, 4294967295]"),
        ("build_index", "--k", "0", ">= 1"),
        ("build_index", "--target-recall", "1.5", "in (0, 1]"),
        ("build_index", "--target-recall", "0", "in (0, 1]"),
        ("build_index", "--num-users", "0", ">= 1"),
        ("build_index", "--train-size", "0", ">= 1"),
        ("build_index", "--max-build-seconds", "0", "> 0"),
        ("build_index", "--seed", "-1", "in [0, 4294967295]"),
    ],
)
def test_a_flag_out_of_range_is_named_as_typed(module: str, flag: str, value: str, expected: str) -> None:
    """Every numeric flag that sets a field: the message names the flag, not the field."""
    parse_args = importlib.import_module(f"retrieval.cli.{module}").parse_args
    floats = ("--lr", "--target-recall", "--max-build-seconds")
    shown = str(float(value)) if flag in floats else value  # a float field: the value as parsed
    with pytest.raises(ValueError, match=f"^{re.escape(f'{flag} {shown}: must be {expected}')}$"):
        parse_args([*REQUIRED[module], flag, value])


def test_a_config_file_out_of_range_names_the_file_and_key(tmp_path: Path) -> None:
    from retrieval.cli.train import parse_args as train_parse
    from retrieval.cli.train_ranker import parse_args as ranker_parse

    (tmp_path / "run.yaml").write_text("train:\n  learning_rate: -1\n")
    message = f"{tmp_path / 'run.yaml'}: train.learning_rate=-1.0: must be > 0"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        train_parse([*REQUIRED["train"], "--config", str(tmp_path / "run.yaml")])
    (tmp_path / "ranker.json").write_text('{"patience": -2}')
    with pytest.raises(ValueError, match=r"ranker\.json: patience=-2: must be >= 0$"):
        ranker_parse(["--print-config", "--config", str(tmp_path / "ranker.json")])


@pytest.mark.parametrize(
    ("module", "flag", "value", "expected"),
    [
        ("train", "--replicas", "0", ">= 1"),  # --strategy mirrored or not: a count
        ("evaluate", "--negatives", "0", ">= 1"),
        ("evaluate", "--seed", "-1", "in [0, 4294967295]"),
        ("prepare", "--partitions", "0", "in [1, 4096]"),
        ("prepare", "--batch-rows", "0", ">= 1"),
    ],
)
def test_a_flag_standing_for_no_field_is_refused_by_the_parser(
    module: str, flag: str, value: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Flags outside the config mechanism reuse its ranges, as argparse errors naming the flag."""
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(f"retrieval.cli.{module}").parse_args([*REQUIRED[module], flag, value])
    assert exited.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(f"error: argument {flag}: must be {expected}, got {value}"), last


CHILD = """
import contextlib, io, sys
from retrieval.cli.dispatch import main
for argv in {runs!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    print(repr((code, err.getvalue().strip())))
print(sorted(m for m in ("tensorflow", "keras", "faiss", "pandas") if m in sys.modules))
"""


def test_mitt_train_refuses_the_issues_settings_before_loading_tensorflow(tmp_path: Path) -> None:
    """The issue's command lines, in a fresh interpreter: exit 2, one line naming the flag or key,
    the value and the range (or the choices), and TensorFlow never imported. The data exists: a
    setting is all that is wrong."""
    data = tmp_path / "log.csv"
    data.write_text("user,item,timestamp\nu,a,1\nu,b,2\nu,c,3\n")
    base = ["train", "--data", str(data), "--out", str(tmp_path / "out"), "--quiet"]
    towers = "expected one of youtubednn, sa, dr, mind, din, sasrec, bert4rec, fmlprec, bsarec"
    expected = {
        ("--set", "train.learning_rate=-1"): "error: train.learning_rate=-1.0: must be > 0",
        ("--set", "model.dropout=1.5"): "error: model.dropout=1.5: must be in [0, 1)",
        ("--dim", "0"): "error: --dim 0: must be >= 1",
        ("--batch-size", "-5"): "error: --batch-size -5: must be >= 1",
        ("--set", "model.tower=transformer"): f"error: model.tower: unknown tower 'transformer'; {towers}",
    }  # fmt: skip
    runs = [[*base, *args] for args in expected]
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(runs=runs)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, check=True,
    )  # fmt: skip
    *results, loaded = done.stdout.strip().splitlines()
    assert [ast.literal_eval(line) for line in results] == [(2, line) for line in expected.values()]
    assert ast.literal_eval(loaded) == []


def test_the_documented_ranges_are_the_declared_ones() -> None:
    """docs/configuration.md's table of ranges lists every numeric field under its own range."""
    from retrieval.config import field_ranges

    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    lines = text.split("### Ranges\n", 1)[1].splitlines()
    start = lines.index("| range | `mitt train` | `mitt train-ranker` | `mitt build-index` |")
    rows = itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2 :])
    command = {RankerConfig: "ranker.", IndexConfig: "index.", MilvusConfig: "index.milvus."}
    documented = {}
    for row in rows:
        allowed, *columns = (cell.strip() for cell in row.strip("|").split("|"))
        for prefix, cell in zip(["", "ranker.", "index."], columns, strict=True):
            documented |= {prefix + key: allowed for key in re.findall(r"`([\w.]+)`", cell)}
    declared = {
        command.get(cls, CONFIGS[cls][1]) + name: str(allowed)
        for cls in CONFIGS
        for name, allowed in field_ranges(cls).items()
    }
    assert documented == declared


def test_a_missing_config_file_is_refused_before_loading_tensorflow(tmp_path: Path) -> None:
    missing = tmp_path / "run.yaml"
    runs = [
        ["train", "--config", str(missing), "--out", str(tmp_path / "out")],
        ["train-ranker", "--config", str(missing), "--print-config"],
        ["build-index", "--config", str(missing), "--model", str(tmp_path), "--out", str(tmp_path / "o")],
    ]
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(runs=runs)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, check=True,
    )  # fmt: skip
    *results, loaded = done.stdout.strip().splitlines()
    line = f"error: cannot read config file {missing}: No such file or directory"
    assert [ast.literal_eval(result) for result in results] == [(2, line)] * len(runs)
    assert ast.literal_eval(loaded) == []
