"""retrieval.data.datasets: datasets are found under the data root the user gives, nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval.data import DATA_ROOT_ENV, DATASETS, DataError, data_root, dataset_at, dataset_path


def make_root(root: Path) -> Path:
    for rel in DATASETS.values():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    return root


def test_an_explicit_root_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path / "env"))
    assert data_root(tmp_path / "given") == tmp_path / "given"
    assert data_root() == tmp_path / "env"


def test_no_root_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with pytest.raises(DataError, match=f"--data-root DIR or set {DATA_ROOT_ENV}"):
        data_root()
    assert dataset_at("anything") is None


def test_dataset_paths_under_the_root(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    assert dataset_path("beauty", root) == root / "amazon-beauty" / "Beauty.txt"
    for name, rel in DATASETS.items():
        assert dataset_at(root / rel, root) == name
    assert dataset_at(tmp_path / "elsewhere.csv", root) is None
    with pytest.raises(DataError, match="unknown dataset 'nope'"):
        dataset_path("nope", root)
    with pytest.raises(DataError, match="not found at"):
        dataset_path("ml100k", tmp_path / "empty")
