"""``mitt build-index``'s settings through the configuration mechanism (``IndexConfig``): the old
flags as shortcuts onto its fields (same names, same defaults), ``--config FILE``, ``--set`` and
``--print-config`` as ``mitt train`` takes them, the fields that go together checked once every
layer is applied, and all of it before FAISS, pandas or TensorFlow is loaded."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from retrieval.artifacts.index_config import IndexConfig, MilvusConfig, resolve_index_config
from retrieval.config import config_from_dict, config_to_dict
from tests.helpers import REPO_ROOT, run_tool

PATHS = ["--model", "runs/m", "--out", "runs/i"]
"""Folders the parser names but never reads."""
FAISS_ONLY = "--uri, --collection, --index-params and --token-env are for --backend milvus"


def printed(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """The configuration ``mitt build-index ARGS --print-config`` prints."""
    assert run_tool("build_index", *args, "--print-config") == 0
    return dict(json.loads(capsys.readouterr().out))


def test_the_defaults_are_the_flags_defaults_before_the_config() -> None:
    """Every flag's default as the parser held it before the settings became a config (f5914f2's
    build_index.py), written out here: a script relying on one still gets it."""
    assert config_to_dict(IndexConfig()) == {
        "backend": "faiss",
        "factory": "Flat",
        "search_params": "",
        "target_recall": None,
        "k": 50,
        "num_users": 1000,
        "train_size": None,
        "max_build_seconds": None,
        "seed": 0,
        "milvus": {
            "uri": None,
            "collection": None,
            "index_type": "HNSW",
            "index_params": {},
            "token_env": None,
        },
    }


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_print_config_round_trips_through_config(
    suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What --print-config prints, given back as --config (no other flag), prints the same text."""
    args = ["--factory", "auto", "--k", "20", "--num-users", "40", "--max-build-seconds", "30"]
    first = run_tool("build_index", *args, "--set", "seed=7", "--set", "train_size=2000", "--print-config")
    assert first == 0
    text = capsys.readouterr().out
    config = config_from_dict(IndexConfig, json.loads(text))
    assert (config.factory, config.k, config.num_users, config.seed, config.train_size) == (
        "auto",
        20,
        40,
        7,
        2000,
    )
    assert config.target_recall == 0.99  # auto's target, resolved and printed
    file = tmp_path / f"index{suffix}"
    file.write_text(text)  # JSON is YAML too
    assert run_tool("build_index", "--config", str(file), "--print-config") == 0
    assert capsys.readouterr().out == text


def test_a_milvus_config_round_trips_and_its_flags_are_shortcuts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = printed(
        capsys, "--backend", "milvus", "--uri", "runs/items.db", "--index-type", "IVF_FLAT",
        "--index-params", '{"nlist": 64}', "--search-params", '{"nprobe": 8}', "--token-env", "TEAM_TOKEN",
    )  # fmt: skip
    keys = printed(
        capsys, "--set", "backend=milvus", "--set", "milvus.uri=runs/items.db",
        "--set", "milvus.index_type=IVF_FLAT", "--set", 'milvus.index_params={"nlist": 64}',
        "--set", 'search_params={"nprobe": 8}', "--set", "milvus.token_env=TEAM_TOKEN",
    )  # fmt: skip
    assert flags == keys
    assert flags["milvus"] == {
        "uri": "runs/items.db",
        "collection": None,
        "index_type": "IVF_FLAT",
        "index_params": {"nlist": 64},
        "token_env": "TEAM_TOKEN",
    }
    (tmp_path / "milvus.yaml").write_text(json.dumps(flags))
    assert printed(capsys, "--config", str(tmp_path / "milvus.yaml")) == flags


def test_layers_apply_in_order_file_flags_then_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "index.yaml").write_text("factory: HNSW32\nk: 10\nsearch_params: efSearch=64\nseed: 3\n")
    config = printed(
        capsys, "--config", str(tmp_path / "index.yaml"), "--k", "25", "--set", "k=30", "--seed", "5"
    )
    assert config["factory"] == "HNSW32" and config["search_params"] == "efSearch=64"  # the file
    assert config["seed"] == 5  # the flag over the file
    assert config["k"] == 30  # --set last


def test_settings_that_do_not_go_together_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """Checked once every layer is applied: one --set may name Milvus before the next gives its uri."""
    for bad, message in [
        (["--backend", "milvus"], "--backend milvus needs --uri"),
        (["--set", "backend=milvus"], "--backend milvus needs --uri"),
        (["--backend", "milvus", "--uri", "x.db", "--factory", "auto"], "--factory and --target-recall tune"),
        (
            ["--backend", "milvus", "--uri", "x.db", "--search-params", "ef=8"],
            "--search-params must be a JSON",
        ),
        (
            ["--backend", "milvus", "--uri", "x.db", "--search-params", "[8]"],
            "--search-params must be a JSON",
        ),
        (["--uri", "x.db"], FAISS_ONLY),
        (["--set", "milvus.collection=items"], FAISS_ONLY),
    ]:
        with pytest.raises(SystemExit) as refused:
            run_tool("build_index", *PATHS, *bad)
        assert refused.value.code == 2
        assert f"error: {message}" in capsys.readouterr().err, bad
    assert printed(capsys, "--set", "backend=milvus", "--set", "milvus.uri=x.db")["backend"] == "milvus"
    milvus = resolve_index_config(IndexConfig(backend="milvus", milvus=MilvusConfig(uri="x.db")))
    assert milvus.target_recall is None  # a Milvus index is not tuned


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--set", "k=0"], "error: k=0: must be >= 1"),
        (["--target-recall", "1.5"], "error: --target-recall 1.5: must be in (0, 1]"),
        (
            ["--set", "backend=annoy"],
            "error: backend: unknown backend 'annoy'; expected one of faiss, milvus",
        ),
        (["--set", "nprobe=16"], "error: unknown index setting 'nprobe' in 'nprobe=16'; choose from "),
    ],
)
def test_a_bad_setting_is_one_line_before_anything_heavy(args: list[str], line: str, tmp_path: Path) -> None:
    """In a fresh interpreter, the model folder existing: exit 2, one line, no FAISS or TensorFlow."""
    argv = ["build-index", "--model", str(tmp_path), "--out", str(tmp_path / "i"), *args]
    child = (
        "import sys\n"
        "from retrieval.cli.dispatch import main\n"
        f"code = main({argv!r})\n"
        "print(code, sorted(m for m in ('tensorflow', 'keras', 'faiss', 'pandas') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120, check=True
    )
    code, loaded = done.stdout.split(" ", 1)
    assert (int(code), ast.literal_eval(loaded)) == (2, [])
    (error,) = done.stderr.strip().splitlines()
    assert error.startswith(line), error


def test_print_config_needs_no_folder_and_a_build_needs_both(capsys: pytest.CaptureFixture[str]) -> None:
    assert printed(capsys)["factory"] == "Flat"
    for given, missing in [([], "--model, --out"), (["--model", "m"], "--out")]:
        with pytest.raises(SystemExit):
            run_tool("build_index", *given)
        assert f"error: the following arguments are required: {missing}" in capsys.readouterr().err
