"""Faults on artifacts: corrupted files, paths that leave the folder, a full disk, ``kill -9``.

A small real model (``tools/train.py``, one epoch of YouTube DNN on data with item attributes,
plus an empty side-feature vocabulary so that every file kind is there) and a Flat index built
from it are damaged in every way listed in issue 9;
each damage must be refused on load with an :class:`ArtifactError`, a failed write must leave the
previous artifact as it was and no temporary folder behind, and a writer killed at any point
must leave the previous artifact (or the new one, whole) where readers look.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import gc
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval.artifacts.arrays import load_vectors, shared_tensor
from retrieval.artifacts.index import build_index_from_model, load_index, save_index
from retrieval.artifacts.model import compiled_tower, load_model
from retrieval.data.vocab import ItemVocab
from retrieval.serving.retriever import Retriever
from retrieval.storage import folders
from retrieval.storage.folders import remove_stale_temporaries, write_artifact
from retrieval.storage.manifest import (
    ArtifactError,
    contained_file,
    derived_version,
    read_manifest,
    sha256_file,
)
from retrieval.storage.versions import publish, resolve_current
from tests.artifacts.helpers import ForkedChild, ForkServer
from tests.helpers import REPO_ROOT, FakeModel, ReloadUnderLoad, run_tool, saved_endpoint, tiered

FILE_KINDS = {
    "config.json", "vocab.json", "item_attributes.json", "side_vocab.json", "item_embeddings.npy",
    "model.keras", "metrics.json", "user_tower/saved_model.pb", "user_tower/fingerprint.pb",
    "user_tower/variables/variables.index", "user_tower/variables/variables.data-00000-of-00001",
    "user_tower/item_vectors.npy",
}  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(model folder, index folder)``: YouTube DNN, one epoch on 60 users with item attributes."""
    base = tmp_path_factory.mktemp("faults")
    rng = np.random.default_rng(7)
    lines = [
        " ".join(map(str, [u, *rng.integers(1, 41, size=int(rng.integers(6, 14)))])) for u in range(1, 61)
    ]
    (base / "Toy.txt").write_text("\n".join(lines) + "\n")
    attributes = {str(i): [f"c{i % 4}", f"b{i % 7}"] for i in range(1, 41)}
    (base / "Toy_item2attributes.json").write_text(json.dumps(attributes))
    model_dir, index_dir = base / "model", base / "index"
    code = run_tool(
        "train", "--data", str(base / "Toy.txt"), "--model", "youtubednn", "--out", str(model_dir),
        "--epochs", "1", "--dim", "16", "--max-len", "12", "--batch-size", "64", "--negatives", "20",
        "--quiet",
    )  # fmt: skip
    assert code == 0
    # The one file kind a model without side features lacks: an (empty) side-feature vocabulary.
    empty = {"features": [], "actions": [], "attributes": [], "max_attributes": 0}
    (model_dir / "side_vocab.json").write_text(json.dumps(empty))
    reseal(model_dir)
    save_index(build_index_from_model(load_model(model_dir), "Flat"), index_dir, load_model(model_dir))
    return model_dir, index_dir


def copy(folder: Path, to: Path) -> Path:
    return Path(shutil.copytree(folder, to / folder.name, symlinks=True))


def reseal(folder: Path, **changes: Any) -> None:
    """Rewrites the manifest with fresh checksums of every file (and ``changes``): the damage a
    checksum cannot see, which the loaders' own checks must refuse."""
    manifest = json.loads((folder / "manifest.json").read_text())
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest["files"] = {p.relative_to(folder).as_posix(): sha256_file(p) for p in files}
    if "index_bytes" in manifest:
        manifest["index_bytes"] = (folder / "index.faiss").stat().st_size
        manifest["version"] = derived_version(manifest["files"])  # index versions are derived
    manifest.update(changes)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


# --- flipped and truncated bytes ----------------------------------------------------------------


def test_every_file_kind_is_there(trained: tuple[Path, Path]) -> None:
    model_dir, index_dir = trained
    assert set(read_manifest(model_dir, "model")["files"]) == FILE_KINDS
    assert set(read_manifest(index_dir, "index")["files"]) == {"index.faiss"}


def test_a_checked_model_still_serves_once_the_loader_is_gone(trained: tuple[Path, Path]) -> None:
    model = load_model(trained[0])
    gc.collect()  # the loader's locals (the SavedModel object) are gone: the tower must still work
    got = model.encode([np.array([1, 2, 3])])
    assert got.shape == (1, 1, 16)
    # Oracle: the exported graph, loaded on its own (a tower whose variables went with the loader
    # would fail or answer something else).
    exported = saved_endpoint(trained[0] / "user_tower")
    items = np.zeros((1, model.max_len), np.int32)
    items[0, -3:] = [1, 2, 3]  # left-padded, as the tower reads histories
    expected = exported({"items": items})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_the_user_tower_reads_its_item_vectors_file(trained: tuple[Path, Path], tmp_path: Path) -> None:
    """The exported tower holds no item table: it reads ``user_tower/item_vectors.npy``, one
    file with ``item_embeddings.npy`` (hard-linked), so that the processes serving it share it."""
    folder = tmp_path / "model"
    shutil.copytree(trained[0], folder)
    table = folder / "user_tower" / "item_vectors.npy"
    assert np.array_equal(np.load(table), np.load(folder / "item_embeddings.npy"))
    trained_table = trained[0] / "user_tower" / "item_vectors.npy"
    assert os.path.samefile(trained_table, trained[0] / "item_embeddings.npy")
    history = [np.array([1, 2, 3])]
    before = load_model(folder).encode(history)
    vectors = np.load(table)
    table.unlink()
    np.save(table, 2.0 * vectors)  # the vectors the tower reads, and only those, doubled
    after = load_model(folder, verify=False).encode(history)
    assert np.abs(after - before).max() > 1e-3


def test_a_shared_tensor_is_the_mapped_memory_itself(tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.arange(12, dtype=np.float32).reshape(4, 3))
    mapped = load_vectors(tmp_path / "t.npy", 4, 3, mmap="c")
    tensor = shared_tensor(mapped)
    np.testing.assert_array_equal(tensor.numpy(), mapped)
    mapped[1, 2] = 42.0  # a copy-on-write page of this process: the tensor sees it, not a copy
    assert float(tensor[1, 2]) == 42.0


def test_the_compiled_tower_answers_as_the_saved_graph(trained: tuple[Path, Path]) -> None:
    """XLA and the padding of batches to its compiled sizes change nothing but float rounding."""
    model = load_model(trained[0], xla=True)
    exported = saved_endpoint(trained[0] / "user_tower")
    rng = np.random.default_rng(0)
    for rows in (1, 3, 5, 17):
        items = rng.integers(0, len(model.vocab) + 1, size=(rows, model.max_len)).astype(np.int32)
        items[0, :-1] = 0  # one history of a single item
        expected = exported({"items": items})
        np.testing.assert_allclose(model.user_vectors({"items": items}), expected, rtol=1e-4, atol=1e-5)


def test_a_tower_xla_cannot_compile_is_served_uncompiled(caplog: pytest.LogCaptureFixture) -> None:
    import tensorflow as tf

    class PythonOpTower:  # tf.numpy_function has no XLA kernel
        @tf.function
        def user_vectors(self, inputs: dict[str, tf.Tensor]) -> tf.Tensor:
            doubled = tf.numpy_function(lambda a: 2 * a, [tf.cast(inputs["items"], tf.float32)], tf.float32)
            return tf.reshape(doubled, [-1, 1, 4])

    tower = compiled_tower(PythonOpTower())
    items = np.arange(12, dtype=np.int32).reshape(3, 4)
    with caplog.at_level(logging.WARNING):
        np.testing.assert_array_equal(tower({"items": items})[:, 0], 2 * items)
    assert "XLA cannot compile" in caplog.text
    np.testing.assert_array_equal(tower({"items": items[:1]})[:, 0], 2 * items[:1])  # stays uncompiled


def test_a_flipped_byte_in_any_file_is_refused(trained: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, index_dir = copy(trained[0], tmp_path), copy(trained[1], tmp_path)
    cases = [(model_dir, name) for name in sorted(FILE_KINDS)] + [(index_dir, "index.faiss")]
    for folder, name in cases:
        data = (folder / name).read_bytes()
        for at in sorted({0, len(data) // 2, len(data) - 1}):
            (folder / name).write_bytes(data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :])
            with pytest.raises(ArtifactError, match=f"{name} is corrupted: checksum does not match"):
                load_model(folder) if folder == model_dir else load_index(folder)
        (folder / name).write_bytes(data)
    load_index(index_dir)
    assert load_model(model_dir).version == read_manifest(trained[0], "model")["version"]


def test_a_truncated_or_missing_file_is_refused(trained: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, index_dir = copy(trained[0], tmp_path), copy(trained[1], tmp_path)
    for folder, name in [(model_dir, n) for n in sorted(FILE_KINDS)] + [(index_dir, "index.faiss")]:
        data = (folder / name).read_bytes()
        load: Callable[[Path], Any] = load_model if folder == model_dir else load_index
        for cut in (len(data) // 2, 0):
            (folder / name).write_bytes(data[:cut])
            with pytest.raises(ArtifactError, match=r"corrupted|truncated"):
                load(folder)
        (folder / name).unlink()
        with pytest.raises(ArtifactError, match=f"incomplete: {name} is missing"):
            load(folder)
        (folder / name).write_bytes(data)
    for name in ("manifest.json",):
        (model_dir / name).unlink()
        with pytest.raises(ArtifactError, match=r"not a model artifact: manifest\.json not found"):
            load_model(model_dir)


def flips(text: bytes) -> Iterator[tuple[int, bytes]]:
    """Every position of ``text`` with one bit flipped (which bit cycles with the position); inside
    SHA-256 digests, every 8th position only (any change there is a checksum mismatch, and the
    digests are half of a manifest)."""
    digits = {
        at
        for m in re.finditer(rb"[0-9a-f]{64}", text)
        for at in range(m.start(), m.end())
        if (at - m.start()) % 8
    }
    for at in range(len(text)):
        if at not in digits:
            yield at, text[:at] + bytes([text[at] ^ (1 << (at % 8))]) + text[at + 1 :]


def harmless(original: bytes, flipped: bytes, free: set[str], optional: set[str]) -> bool:
    """The flipped manifest means the same to the loaders: it parses to the same content but for
    the value of a ``free`` (free text) field, an ``optional`` field renamed away (its key hit),
    or an unknown key (the renamed one)."""
    try:
        before, after = json.loads(original), json.loads(flipped)
    except (ValueError, UnicodeDecodeError):
        return False
    if not isinstance(after, dict) or not set(before) - set(after) <= optional:
        return False
    return all(after[k] == v for k, v in before.items() if k in after and k not in free)


def test_a_bit_flip_anywhere_in_the_model_manifest_is_refused(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    # Every field that matters is checked against the files (config.json, the vocabulary, the
    # embeddings, the tower) or, for the version, against the index built from the model.
    # Only "created" is free text; the keys of fields that are only cross-checked may be hit
    # (the field is then missing, which changes nothing; a missing "explanation" reads as a
    # model from before explanations, which has none to give, like this YouTube DNN; a missing
    # "tower_items" reads as every item, as in a model from before catalogue changes; a missing
    # "similarity" reads as dot, as in a model from before cosine similarity); flips
    # that keep the content are skipped.
    model_dir, index_dir = copy(trained[0], tmp_path), trained[1]
    original = (model_dir / "manifest.json").read_bytes()
    optional = {
        "created",
        "data",
        "fusion",
        "inputs",
        "side_features",
        "explanation",
        "tower_items",
        "similarity",
    }
    refused = tried = 0
    for at, flipped in flips(original):
        tried += 1
        if harmless(original, flipped, {"created"}, optional):
            continue
        (model_dir / "manifest.json").write_bytes(flipped)
        with pytest.raises(ArtifactError):
            Retriever.from_dirs(model_dir, index_dir)
            pytest.fail(f"byte {at} flipped ({original[at - 20 : at + 20]!r}) was not refused")
        refused += 1
    assert refused > 0.9 * tried
    (model_dir / "manifest.json").write_bytes(original)
    Retriever.from_dirs(model_dir, index_dir)


def test_a_bit_flip_anywhere_in_the_index_manifest_is_refused(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    model_dir, index_dir = trained[0], copy(trained[1], tmp_path)
    version = read_manifest(model_dir, "model")["version"]
    original = (index_dir / "manifest.json").read_bytes()
    informational = {"created", "faiss_version", "measured", "tuning"}
    for at, flipped in flips(original):
        # Fields with a default for older manifests may lose their key (the default is what it says).
        defaulted = {"metric", "is_exact", "backend", "index_file", "index_bytes"}
        if harmless(original, flipped, informational, informational | defaulted):
            continue
        (index_dir / "manifest.json").write_bytes(flipped)
        with pytest.raises(ArtifactError):
            load_index(index_dir, expected_model_version=version)
            pytest.fail(f"byte {at} flipped ({original[at - 20 : at + 20]!r}) was not refused")


# --- damage a checksum cannot see (the manifest rewritten to match) ------------------------------


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def test_consistent_damage_is_refused_by_the_model_loader(trained: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir = trained[0]
    table = np.load(model_dir / "item_embeddings.npy")
    vocab = json.loads((model_dir / "vocab.json").read_text())
    config = json.loads((model_dir / "config.json").read_text())
    manifest = read_manifest(model_dir, "model")
    pickled = np.empty(2, object)
    pickled[:] = [{"a": 1}, [2]]
    duplicate_ids = json.dumps({**vocab, "ids": [vocab["ids"][0]] * 40}).encode()
    side_vocab_with_action = json.dumps(
        {"features": ["action"], "actions": ["1"], "attributes": [], "max_attributes": 0}
    ).encode()
    longer_window = json.dumps({**config, "model": {**config["model"], "max_len": 13}}).encode()
    cases: list[tuple[str, dict[str, bytes], dict[str, Any], str]] = [
        ("pickle", {"item_embeddings.npy": npy(pickled, allow_pickle=True)}, {}, "not a readable .npy"),
        ("nan", {"item_embeddings.npy": npy(np.where(table == table[1, 0], np.nan, table))}, {}, "NaN"),
        ("float64", {"item_embeddings.npy": npy(table.astype(np.float64))}, {}, "float64"),
        ("rows", {"item_embeddings.npy": npy(table[:-1])}, {}, r"expected float32 \[41, d\]"),
        ("npy header", {"item_embeddings.npy": b"\x93NUMPY\x01\x00garbage"}, {}, "not a readable .npy"),
        ("vocab dup", {"vocab.json": duplicate_ids}, {}, "unique"),
        ("vocab ints", {"vocab.json": json.dumps({**vocab, "ids": list(range(40))}).encode()}, {}, "strings"),
        ("vocab json", {"vocab.json": b'{"ids": ['}, {}, "not a valid vocabulary"),
        ("side vocab", {"side_vocab.json": b'{"features": 5}'}, {}, "not a valid side-feature"),
        ("tower", {"user_tower/saved_model.pb": b"\x08\x01garbage"}, {}, "not a readable user tower"),
        ("config", {"config.json": longer_window}, {}, "max_len is 12, the artifact's files say 13"),
        ("max_len", {}, {"max_len": 13}, "max_len is 13"),
        ("dim", {}, {"dim": 17}, "dim is 17, the artifact.s files say 16"),
        ("num_items", {}, {"num_items": 39}, "39 items"),
        ("num_interests", {}, {"num_interests": 2}, r"answers \[1, 1, 16\]"),
        ("tower name", {}, {"tower": "mind"}, "tower is 'mind'"),
        ("side inputs", {"side_vocab.json": side_vocab_with_action}, {}, r"inputs is \['items'\]"),
        ("inputs", {}, {"inputs": ["items", "action"]}, "inputs is"),
        ("format", {}, {"format_version": 2}, "format version 2"),
        ("no version", {}, {"version": ""}, "no version"),
        ("not listed", {}, {"files": {k: v for k, v in manifest["files"].items() if k != "vocab.json"}},
         "vocab.json is not listed"),
        ("files type", {}, {"files": ["vocab.json"]}, "'files' must map"),
        ("checksum", {}, {"files": {**manifest["files"], "vocab.json": "abc"}}, "not a SHA-256"),
    ]  # fmt: skip
    for name, files, changes, message in cases:
        folder = copy(model_dir, tmp_path / name.replace(" ", "-"))
        for file, content in files.items():
            (folder / file).write_bytes(content)
        reseal(folder)
        if changes:
            manifest_now = json.loads((folder / "manifest.json").read_text())
            (folder / "manifest.json").write_text(json.dumps({**manifest_now, **changes}))
        with pytest.raises(ArtifactError, match=message):
            load_model(folder)
    # Files added after writing (not covered by any checksum) are refused where the tower is read.
    folder = copy(model_dir, tmp_path / "extra")
    (folder / "user_tower" / "variables" / "extra.data").write_bytes(b"\x00")
    with pytest.raises(ArtifactError, match=r"user_tower/variables/extra\.data not listed"):
        load_model(folder)
    # A manifest that is not a JSON object.
    (folder / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ArtifactError, match="not a JSON object"):
        load_model(folder)


def test_consistent_damage_is_refused_by_the_index_loader(trained: tuple[Path, Path], tmp_path: Path) -> None:
    index_dir = trained[1]
    data = (index_dir / "index.faiss").read_bytes()
    cases: list[tuple[str, bytes, dict[str, Any], str]] = [
        ("foreign", b"GGUF" + data[4:], {}, "expected an IDMap2 index"),
        ("short", data[:-64], {}, "not a readable FAISS index"),
        ("count", data, {"count": 41}, "manifest says dim 16 and 41"),
        ("dim", data, {"dim": 8}, "manifest says dim 8"),
        ("exact", data, {"is_exact": False}, "another index type"),
        ("metric", data, {"metric": "l2"}, "metric 'l2'"),
        ("backend", data, {"backend": "annoy"}, "unknown index backend"),
        ("dim type", data, {"dim": "16"}, "dim must be a int"),
        ("index file", data, {"index_file": "manifest.json"}, "is not the faiss index file"),
        ("mips", data, {"mips_norm": float("nan")}, "mips_norm must be a positive number"),
        ("model version", data, {"model_version": "other-model"}, "built from model 'other-model'"),
    ]
    expected = read_manifest(trained[0], "model")["version"]
    for name, payload, changes, message in cases:
        folder = copy(index_dir, tmp_path / name)
        (folder / "index.faiss").write_bytes(payload)
        reseal(folder, **changes)
        with pytest.raises(ArtifactError, match=message):
            load_index(folder, expected_model_version=expected)


def test_a_model_and_index_of_different_versions_are_refused(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    model_dir, index_dir = copy(trained[0], tmp_path), copy(trained[1], tmp_path)
    reseal(index_dir, model_version="another-model")
    with pytest.raises(ArtifactError, match="not from model"):
        Retriever.from_dirs(model_dir, index_dir)
    reseal(index_dir, model_version=read_manifest(model_dir, "model")["version"])
    reseal(model_dir, version="renamed-model")  # a model folder that claims another version
    with pytest.raises(ArtifactError, match="not from model 'renamed-model'"):
        Retriever.from_dirs(model_dir, index_dir)


# --- paths that leave the folder ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../outside.json", "/etc/hostname", "vocab.json/../../outside.json", "./vocab.json", "a//b", ""]
)
def test_manifest_paths_outside_the_folder_are_refused(
    trained: tuple[Path, Path], tmp_path: Path, name: str
) -> None:
    folder = copy(trained[0], tmp_path)
    (tmp_path / "outside.json").write_text("{}")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = sha256_file(tmp_path / "outside.json")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for verify in (True, False):
        with pytest.raises(ArtifactError, match=r"not a path inside the artifact|outside the artifact"):
            read_manifest(folder, "model", verify=verify)
    with pytest.raises(ArtifactError):
        load_model(folder)


def test_symlinks_out_of_the_folder_are_refused(trained: tuple[Path, Path], tmp_path: Path) -> None:
    # Same bytes, so the checksum matches: only the path check can refuse them.
    model_dir, index_dir = copy(trained[0], tmp_path / "m"), copy(trained[1], tmp_path / "i")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(model_dir / "vocab.json", outside / "vocab.json")
    (model_dir / "vocab.json").unlink()
    (model_dir / "vocab.json").symlink_to(outside / "vocab.json")
    with pytest.raises(ArtifactError, match=r"'vocab\.json', which is outside the artifact"):
        load_model(model_dir)
    (model_dir / "vocab.json").unlink()
    shutil.copy(outside / "vocab.json", model_dir / "vocab.json")
    shutil.move(model_dir / "user_tower", outside / "user_tower")  # a whole folder elsewhere
    (model_dir / "user_tower").symlink_to(outside / "user_tower", target_is_directory=True)
    with pytest.raises(ArtifactError, match="outside the artifact"):
        load_model(model_dir)
    # The index file named by the manifest must be the plain file inside the folder.
    shutil.copy(index_dir / "index.faiss", outside / "index.faiss")
    for name in ("../outside/index.faiss", str(outside / "index.faiss")):
        reseal(index_dir, index_file=name)
        with pytest.raises(ArtifactError, match="is not the faiss index file"):
            load_index(index_dir)
    reseal(index_dir, index_file="index.faiss")
    (index_dir / "index.faiss").unlink()
    (index_dir / "index.faiss").symlink_to(outside / "index.faiss")
    with pytest.raises(ArtifactError, match="outside the artifact"):
        load_index(index_dir)
    with pytest.raises(ArtifactError, match="not a path inside"):
        contained_file(index_dir, "../outside/index.faiss")


# --- a full disk --------------------------------------------------------------------------------


class FullDisk:
    """``open()`` for files under ``folder`` fails with ENOSPC once ``budget`` bytes are written
    (the bytes that fit are written first, as a real full disk does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path, budget: int) -> None:
        self.folder, self.budget, self.used = str(folder.resolve()), budget, 0
        real_open = builtins.open

        def limited_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            handle = real_open(file, mode, *args, **kwargs)
            writing = any(c in mode for c in "wax+")
            if (
                writing
                and isinstance(file, str | os.PathLike)
                and os.path.abspath(file).startswith(self.folder)
            ):
                return _Limited(handle, self, str(file))
            return handle

        monkeypatch.setattr(builtins, "open", limited_open)
        monkeypatch.setattr(io, "open", limited_open)


class _Limited:
    def __init__(self, handle: Any, disk: FullDisk, name: str) -> None:
        self._handle, self._disk, self._name = handle, disk, name

    def write(self, data: Any) -> int:
        size = len(memoryview(data).cast("B")) if not isinstance(data, str) else len(data.encode())
        room = self._disk.budget - self._disk.used
        if size > room:
            if room > 0:
                self._handle.write(data[:room])
                self._disk.used += room
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._name)
        self._disk.used += size
        return int(self._handle.write(data))

    def __enter__(self) -> _Limited:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def write_model_like(out: Path, version: str, overwrite: bool = True) -> None:
    """An artifact with the file types a model has (JSON, .npy), written like ``save_model``."""
    with write_artifact(out, "model", {"version": version, "max_len": 8}, overwrite=overwrite) as tmp:
        (tmp / "config.json").write_text(json.dumps({"model": {"max_len": 8}}))
        ItemVocab.from_ids([f"item{i}" for i in range(300)]).save(tmp / "vocab.json")
        np.save(tmp / "item_embeddings.npy", np.ones((301, 16), np.float32))
        (tmp / "user_tower").mkdir()
        (tmp / "user_tower" / "saved_model.pb").write_bytes(b"\x00" * 3000)
        (tmp / "metrics.json").write_text(json.dumps({"test": {"hr@10": 0.1}}, indent=2))


def assert_intact(out: Path, version: str) -> None:
    """``out`` holds the artifact ``version``, verified, and nothing else is beside it."""
    assert read_manifest(out, "model")["version"] == version
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]


def test_a_full_disk_at_any_byte_leaves_the_old_artifact(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "disk" / "model"
    write_model_like(out, "old", overwrite=False)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    for budget in sorted({0, 1, 100, 2000, 5000, 7000, total // 2, total - 100, total - 1}):
        with monkeypatch.context() as patch:
            FullDisk(patch, out.parent, budget)
            with pytest.raises(
                ArtifactError, match=r"could not write the model artifact .*No space left on device"
            ):
                write_model_like(out, "new")
        assert_intact(out, "old")
    with monkeypatch.context() as patch:
        FullDisk(patch, out.parent, total + 100)  # enough room: the write goes through
        write_model_like(out, "new")
    assert_intact(out, "new")


@pytest.mark.parametrize("step", ["fsync", "exchange", "fallback rename"])
def test_a_failure_while_moving_into_place_leaves_the_old_artifact(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, step: str
) -> None:
    out = tmp_path / "disk" / "model"
    write_model_like(out, "old", overwrite=False)

    def enospc(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if step == "fsync":
        monkeypatch.setattr(folders.os, "fsync", enospc)
    elif step == "exchange":
        monkeypatch.setattr(folders, "_exchange", enospc)
    else:  # no atomic exchange: the second of the two renames fails, the first is undone
        real_rename = os.rename
        calls: list[str] = []

        def rename(src: Any, dst: Any) -> None:
            calls.append(f"{Path(src).name} -> {Path(dst).name}")
            if len(calls) == 2:
                enospc()
            real_rename(src, dst)

        monkeypatch.setattr(folders, "_exchange", lambda a, b: False)
        monkeypatch.setattr(folders.os, "rename", rename)
    with pytest.raises(ArtifactError, match=r"No space left on device.*previous one is unchanged"):
        write_model_like(out, "new")
    monkeypatch.undo()
    assert_intact(out, "old")


def test_a_real_write_error_in_faiss_leaves_the_old_index(tmp_path: Path) -> None:
    """``RLIMIT_FSIZE`` makes the kernel refuse FAISS's own (C++) writes past 1 MB."""
    script = textwrap.dedent(
        """
        import resource, signal, sys
        import numpy as np
        from pathlib import Path
        from index import FaissIndex
        from retrieval.artifacts.index import save_index
        out = Path(sys.argv[1])
        vectors = np.random.default_rng(0).normal(size=(20000, 32)).astype(np.float32)
        index = FaissIndex.build(np.arange(1, 20001), vectors)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))
        try:
            save_index(index, out, "model-v2", overwrite=True)
        except Exception as e:
            print(type(e).__name__, e)
        """
    )
    out = tmp_path / "disk" / "index"
    model = FakeModel.make(2000, "model-v1")
    save_index(build_index_from_model(model), out, model)
    result = subprocess.run(
        [sys.executable, "-c", script, str(out)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )
    # FAISS's own write error becomes the ArtifactError every tool reports without a traceback.
    assert result.stdout.startswith("ArtifactError") and "File too large" in result.stdout, (
        result.stdout + result.stderr
    )
    assert load_index(out)[1]["model_version"] == "model-v1"
    assert sorted(p.name for p in out.parent.iterdir()) == ["index"]


# --- kill -9 ------------------------------------------------------------------------------------


BUILD_INDEX_CHILD = """
import sys
sys.path.insert(0, {repo!r})
import retrieval.artifacts
from tests.helpers import FakeModel
retrieval.artifacts.load_model = lambda path, verify=True: FakeModel.make({n}, {version!r})
from tests.helpers import run_tool
sys.exit(run_tool("build_index", *sys.argv[1:]))
"""


KILL_ITEMS = 100_000
"""Items of the fake model whose index the killed tool writes: a 13 MB index.faiss."""


def run_killed(argv: list[str], watch: Path, delay: float | None, version: str) -> tuple[bool, float]:
    """Runs ``tools/build_index.py`` over a fake model and SIGKILLs it ``delay`` seconds after its
    temporary folder appears in ``watch`` (``None``: lets it finish).

    Returns:
        ``(killed, seconds from the folder appearing to the kill or, unkilled, to the folder
        disappearing: renamed into place)``.
    """
    child = BUILD_INDEX_CHILD.format(repo=str(REPO_ROOT), n=KILL_ITEMS, version=version)
    process = subprocess.Popen(
        [sys.executable, "-c", child, *argv], cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        if watch.is_dir() and any(".tmp-" in p.name for p in watch.iterdir()):
            break
        time.sleep(0.0005)
    appeared = time.monotonic()
    killed = False
    if delay is None:
        while process.poll() is None and any(".tmp-" in p.name for p in watch.iterdir()):
            time.sleep(0.0005)
    else:
        time.sleep(delay)
        killed = process.poll() is None
        if killed:
            process.send_signal(signal.SIGKILL)
    seconds = time.monotonic() - appeared
    _, stderr = process.communicate(timeout=120)
    assert killed or process.returncode == 0, stderr.decode()[-2000:]
    return killed, seconds


def start_state(tmp_path: Path, mode: str) -> tuple[Path, list[str], Path]:
    """An index of "model-v1" at ``tmp_path/index`` (a folder, or a published root), the tool's
    arguments to replace it with one of "model-v2" (the fake model is loaded: ``--model`` names a
    folder that exists, as the tool checks first), and the folder its temporary folder goes to."""
    old_model = FakeModel.make(2000, "model-v1")
    out = tmp_path / "index"
    args = ["--model", str(tmp_path), "--out", str(out), "--num-users", "20"]
    if mode == "folder":
        save_index(build_index_from_model(old_model), out, old_model)
        return out, [*args, "--overwrite"], tmp_path
    publish(out, lambda folder: save_index(build_index_from_model(old_model), folder, old_model))
    return out, [*args, "--publish"], out / "versions"


@pytest.fixture(scope="module")
def write_seconds(tmp_path_factory: pytest.TempPathFactory) -> float:
    """How long the tool's temporary folder exists (index written, hashed, synced, renamed)."""
    _, argv, watch = start_state(tmp_path_factory.mktemp("calibrate"), "folder")
    return run_killed(argv, watch, None, "model-v2")[1]


@pytest.mark.slow  # timed kills of a 13 MB index write: six runs of 1-2 s and a calibration run
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", ["folder", "published root"])
def test_kill_9_during_build_index_leaves_a_loadable_index(
    tmp_path: Path, mode: str, seed: int, write_seconds: float
) -> None:
    out, argv, watch = start_state(tmp_path, mode)
    delay = float(np.random.default_rng(seed).uniform(0, write_seconds))  # a random point of the write
    killed, _ = run_killed(argv, watch, delay, "model-v2")
    index, manifest = load_index(out)  # the previous index, or the new one whole
    print(f"{mode}, seed {seed}: SIGKILL {delay:.3f} of {write_seconds:.3f} s into the write: {killed}; "
          f"{manifest['model_version']} loads")  # fmt: skip
    assert manifest["model_version"] in ("model-v1", "model-v2")
    assert index.ntotal == {"model-v1": 2000, "model-v2": KILL_ITEMS}[manifest["model_version"]]
    if mode == "published root":  # every version folder a reader could be pointed to is whole
        for version in (p for p in (out / "versions").iterdir() if not p.name.startswith(".")):
            load_index(version)
    # The killed writer's temporary folder is removed by the next write beside it.
    remove_stale_temporaries(watch)
    assert not [p for p in watch.iterdir() if ".tmp-" in p.name]


STEP_CHILD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from retrieval.storage.folders import write_artifact
from retrieval.storage.versions import publish
mode, out, kill_at = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
EVENTS = {{"open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.unlink",
          "shutil.rmtree", "ctypes.call_function", "os.chmod", "os.listdir", "os.scandir"}}
count = 0
def hook(event, args):
    global count
    if event in EVENTS:
        count += 1
        if count == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
def write(folder):
    with write_artifact(folder, "demo", {{"version": "new"}}, overwrite=True) as tmp:
        (tmp / "a.bin").write_bytes(b"a" * 5000)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("b")
sys.addaudithook(hook)
write(out) if mode == "folder" else publish(out, write)
print(count)
"""


def write_demo(folder: Path, version: str) -> None:
    with write_artifact(folder, "demo", {"version": version}, overwrite=True) as tmp:
        (tmp / "a.bin").write_bytes(b"old" * 100)


@pytest.mark.parametrize("mode", tiered(["folder", "published root"], slow={"published root"}))
def test_kill_9_at_every_file_system_step_leaves_a_whole_artifact(tmp_path: Path, mode: str) -> None:
    """Deterministic complement to the timed kills: the writer kills itself at its n-th file-system
    call (open, mkdir, rename, renameat2, rmtree, ...) for every n, including between the renames."""
    child = STEP_CHILD.format(repo=str(REPO_ROOT))
    template = tmp_path / "template" / "artifact"
    write_demo(template, "old") if mode == "folder" else publish(template, lambda f: write_demo(f, "old"))

    def run(kill_at: int) -> tuple[Path, subprocess.CompletedProcess[str]]:
        work = tmp_path / f"run-{kill_at}"
        shutil.copytree(template.parent, work, symlinks=True)
        out = work / "artifact"
        done = subprocess.run(
            [sys.executable, "-c", child, mode, str(out), str(kill_at)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out, done

    _, dry = run(0)
    steps = int(dry.stdout.strip())
    assert steps > 10
    seen = set()
    for kill_at in range(1, steps + 1):
        out, done = run(kill_at)
        assert done.returncode == -signal.SIGKILL, (kill_at, done.stdout, done.stderr)
        folder = resolve_current(out)
        manifest = read_manifest(folder, "demo")  # whole: every checksum verifies
        seen.add(manifest["version"])
        if mode == "published root":
            for version in (p for p in (out / "versions").iterdir() if not p.name.startswith(".")):
                assert read_manifest(version, "demo")["version"] in ("old", "new")
        parent = out.parent if mode == "folder" else out / "versions"
        remove_stale_temporaries(parent)
        leftovers = [p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
        assert not leftovers, (kill_at, leftovers)
        shutil.rmtree(out.parent)
    assert seen == {"old", "new"}  # kills landed both before and after the switch


# --- kill -9 during training --------------------------------------------------------------------

TRAIN_CHILD = """
import json, os, signal, sys, threading
sys.path.insert(0, {repo!r})
import retrieval.training.callbacks as callbacks, retrieval.training.run as training
from tests.helpers import run_tool
phase_to_kill, call_to_kill, kill_at, report = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
calls = {{"checkpoint": [], "artifact": []}}  # per call of the phase: its file-system events
active = None
main_thread = threading.get_ident()
def hook(event, args):
    if active is None or threading.get_ident() != main_thread or not event.startswith({prefixes!r}):
        return
    events = calls[active][-1]
    events.append([event, str(args[0]) if args else ""])
    if active == phase_to_kill and len(calls[active]) == call_to_kill and len(events) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
def watched(phase, function, last):
    def run(*args, **kwargs):
        global active
        calls[phase].append([])
        active = phase
        try:
            return function(*args, **kwargs)
        finally:
            active = None if not last else active  # the artifact phase lasts until the exit
    return run
callbacks.save_checkpoint = watched("checkpoint", callbacks.save_checkpoint, False)
training.save_model = watched("artifact", training.save_model, True)
sys.addaudithook(hook)
code = run_tool("train", *sys.argv[5:])
active = None
with open(report, "w") as f:
    json.dump(calls, f)
sys.exit(code)
"""
FS_EVENTS = ("open", "os.", "shutil.", "ctypes.")
"""Audit events of file-system calls (``open``, ``os.rename``, ``os.remove``, ``shutil.rmtree``, ...);
``renameat2``, called through ctypes, raises none itself, but its ``ctypes.dlopen``/``dlsym`` come
right before it, so a kill lands on each side of the atomic exchange."""

RUN_TOOL_CHILD = """
import runpy, sys
tool, sys.argv[1:] = sys.argv[1], sys.argv[2:]
runpy.run_path(tool, run_name="__main__")
"""
"""``python TOOL ARGS`` as ``python -c RUN_TOOL_CHILD TOOL ARGS`` (a child :class:`ForkServer` can fork)."""

TRAIN_EPOCHS = 5
TRAIN_ARGS = [
    "--model", "youtubednn", "--epochs", str(TRAIN_EPOCHS), "--dim", "8", "--max-len", "8",
    "--negatives", "10", "--batch-size", "4", "--set", "train.patience=3", "--quiet",
]  # fmt: skip
"""A tiny run of 124 steps per epoch (~0.5-1 s here) with early stopping's state in every checkpoint."""


def start_training(
    server: ForkServer,
    data: Path,
    out: Path,
    report: Path,
    phase: str = "none",
    call: int = 0,
    kill_at: int = 0,
    *extra: str,
) -> ForkedChild:
    """``tools/train.py --data DATA --out OUT TRAIN_ARGS EXTRA`` in a child process (forked by
    ``server``) that writes the file-system events of each checkpoint and of the artifact write
    (to the exit) to ``report``, and SIGKILLs itself at the ``kill_at``-th event of the
    ``call``-th write of ``phase``."""
    child = TRAIN_CHILD.format(repo=str(REPO_ROOT), prefixes=FS_EVENTS)
    argv = [phase, str(call), str(kill_at), str(report), "--data", str(data), "--out", str(out)]
    return server.start(child, *argv, *TRAIN_ARGS, *extra)


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """The kill -9 series' children (a training, a deploy), forked with TensorFlow imported: a
    fresh interpreter's ~6 s of imports, paid once instead of in each of ~30 children."""
    server = ForkServer(tmp_path_factory.mktemp("fork-server"))
    yield server
    server.close()


# The kill -9 series during training below is marked slow: 5 to 11 s a test here (a child trains
# five epochs, is killed, and resumes; 14 to 20 s when each child imported TensorFlow itself).


@dataclass(frozen=True)
class Training:
    """The kill -9 series' trainings: the fork server their children start from, the data they
    train on, and an uninterrupted run's losses and file-system events (``reference``: the
    ``events`` of every checkpoint and of the artifact write, where the kills are drawn from, its
    ``losses`` and its ``out``)."""

    server: ForkServer
    data: Path
    reference: dict[str, Any]

    def start(self, out: Path, report: Path, *kill: Any) -> ForkedChild:
        """:func:`start_training` of this data; ``kill``: its ``phase, call, kill_at, *extra``."""
        return start_training(self.server, self.data, out, report, *kill)


@pytest.fixture(scope="module")
def training(
    fork_server: ForkServer, synthetic_csv: Path, tmp_path_factory: pytest.TempPathFactory
) -> Training:
    """The series' :class:`Training`, its reference run made once."""
    base = tmp_path_factory.mktemp("train-reference")
    process = start_training(fork_server, synthetic_csv, base / "model", base / "events.json")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    events = json.loads((base / "events.json").read_text())
    assert len(events["checkpoint"]) == TRAIN_EPOCHS and len(events["artifact"]) == 1
    metrics = json.loads((base / "model" / "metrics.json").read_text())
    reference = {"events": events, "losses": metrics["train_loss_per_epoch"], "out": base / "model"}
    return Training(fork_server, synthetic_csv, reference)


def checkpoint_epoch(run: Path) -> int:
    """Epochs completed in the run's checkpoint (verified: every checksum), 0 without one."""
    if not (run / "checkpoint").exists():
        return 0
    return int(read_manifest(run / "checkpoint", "checkpoint")["epoch"])


def assert_nothing_half_written_is_visible(out: Path, pid: int) -> int:
    """After a kill: no artifact at ``out``; the run folder holds a whole checkpoint or none; every
    other folder is a temporary of the killed writer (hidden, removed by the next write).

    Returns:
        The epochs of the checkpoint a resume will start from.
    """
    assert not out.exists()
    run = out.with_name(out.name + ".partial")
    assert (run / "config.json").is_file()
    hidden = [p for p in [*run.iterdir(), *out.parent.iterdir()] if p.name.startswith(".")]
    for folder in hidden:
        match = folders._TEMPORARY.match(folder.name)
        assert match is not None and int(match["pid"]) == pid, folder
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) in (
        ["config.json"],
        ["checkpoint", "config.json"],
    )
    return checkpoint_epoch(run)


def resume_and_check(training: Training, out: Path, epoch: int) -> None:
    """``--resume`` continues from the checkpoint's epoch, writes an artifact that loads, trained
    exactly as the uninterrupted run, and removes the run folder and every leftover."""
    started = time.monotonic()
    process = training.start(out, out.parent / "resume-events.json", "none", 0, 0, "--resume")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    run = out.with_name(out.name + ".partial")
    expected = f"resuming {run} after epoch {epoch}" if epoch else "has no checkpoint yet"
    assert expected in stderr
    load_model(out)  # verifies every checksum and loads the tower
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs_trained"] == TRAIN_EPOCHS
    np.testing.assert_allclose(metrics["train_loss_per_epoch"], training.reference["losses"], rtol=1e-5)
    assert sorted(p.name for p in out.parent.iterdir() if p.name != "resume-events.json") == [out.name]
    print(f"resumed after epoch {epoch} in {time.monotonic() - started:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_mid_epoch_then_resume(training: Training, tmp_path: Path, seed: int) -> None:
    """SIGKILL from outside at a random moment of the third epoch (timed from the second: a
    machine that speeds up may move it into the fourth)."""
    out = tmp_path / "model"
    process = training.start(out, tmp_path / "events.json")
    run = out.with_name(out.name + ".partial")
    seen: dict[int, float] = {}
    deadline = time.monotonic() + 240
    while 2 not in seen and process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            epoch = json.loads((run / "checkpoint" / "manifest.json").read_text())["epoch"]
            seen.setdefault(epoch, time.monotonic())
        time.sleep(0.002)
    assert 1 in seen and 2 in seen, f"no checkpoints of epochs 1 and 2 seen: {seen}"
    epoch_seconds = seen[2] - seen[1]
    delay = float(np.random.default_rng(seed).uniform(0, epoch_seconds))
    time.sleep(max(0.0, seen[2] + delay - time.monotonic()))
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    epoch = assert_nothing_half_written_is_visible(out, process.pid)
    print(f"seed {seed}: killed {delay:.3f} s after checkpoint 2 (epochs take {epoch_seconds:.3f} s): "
          f"checkpoint of epoch {epoch}")  # fmt: skip
    assert 2 <= epoch < TRAIN_EPOCHS
    resume_and_check(training, out, epoch)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_mid_checkpoint_write_then_resume(training: Training, tmp_path: Path, seed: int) -> None:
    """SIGKILL at a random file-system step of a random epoch's checkpoint write (the first one
    has no previous checkpoint; the others replace one)."""
    rng = np.random.default_rng(seed)
    writes = training.reference["events"]["checkpoint"]
    call = int(rng.integers(1, 3))  # 1 or 2: a first checkpoint, or one that replaces another
    kill_at = int(rng.integers(1, len(writes[call - 1]) + 1))
    out = tmp_path / "model"
    process = training.start(out, tmp_path / "events.json", "checkpoint", call, kill_at)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL, stderr[-3000:]
    epoch = assert_nothing_half_written_is_visible(out, process.pid)
    step = writes[call - 1][kill_at - 1]
    print(f"seed {seed}: killed at step {kill_at}/{len(writes[call - 1])} ({step[0]}) of checkpoint "
          f"{call}: checkpoint of epoch {epoch}")  # fmt: skip
    assert epoch in (call - 1, call)  # the previous checkpoint, or the new one whole
    resume_and_check(training, out, epoch)


def artifact_steps(reference: dict[str, Any]) -> tuple[list[list[str]], int, int]:
    """The artifact phase's file-system events, the (1-based) step that renames the finished
    artifact into place, and the first step on the run folder after it (its removal)."""
    steps = reference["events"]["artifact"][0]
    out = str(reference["out"])
    rename = next(i for i, (event, arg) in enumerate(steps, 1) if event == "os.rename" and ".tmp-" in arg)
    assert steps[rename - 1][1].startswith(str(reference["out"].parent)) and out not in steps[rename - 1][1]
    cleanup = next(i for i, (_, arg) in enumerate(steps, 1) if i > rename and arg == out + ".partial")
    return steps, rename, cleanup


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_kill_9_mid_artifact_write_then_resume(training: Training, tmp_path: Path, seed: int) -> None:
    """SIGKILL at a random file-system step of writing the finished model artifact, up to the
    rename that puts it in place: no artifact appears, and the resume only exports it."""
    steps, rename, _ = artifact_steps(training.reference)
    kill_at = int(np.random.default_rng(seed).integers(1, rename + 1))
    out = tmp_path / "model"
    process = training.start(out, tmp_path / "events.json", "artifact", 1, kill_at)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL, stderr[-3000:]
    print(f"seed {seed}: killed at step {kill_at}/{rename} ({steps[kill_at - 1][0]}) of the artifact write")
    assert assert_nothing_half_written_is_visible(out, process.pid) == TRAIN_EPOCHS
    resume_and_check(training, out, TRAIN_EPOCHS)


@pytest.mark.slow
def test_kill_9_after_the_artifact_is_in_place_then_resume(training: Training, tmp_path: Path) -> None:
    """SIGKILL while the finished run removes its run folder (the artifact already in place):
    the artifact is whole, the half-removed checkpoint is never loaded, and the same command with
    ``--resume`` finishes the run (nothing left to train) and clears the run folder."""
    steps, _, cleanup = artifact_steps(training.reference)
    removals = [i for i, (event, _) in enumerate(steps, 1) if event == "os.remove" and i > cleanup]
    kill_at = removals[1]  # the checkpoint's first file is gone, the others are still there
    out = tmp_path / "model"
    process = training.start(out, tmp_path / "events.json", "artifact", 1, kill_at)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL, stderr[-3000:]
    load_model(out)  # the artifact is whole
    run = out.with_name(out.name + ".partial")
    if run.exists():  # what is left of the checkpoint is refused, never loaded
        with pytest.raises(ArtifactError):
            checkpoint_epoch(run)
    resumed = training.server.run(
        RUN_TOOL_CHILD, str(REPO_ROOT / "tools" / "train.py"), "--data", str(training.data), "--out",
        str(out), *TRAIN_ARGS, "--resume", timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    load_model(out)
    assert [p.name for p in tmp_path.iterdir() if p.name != "events.json"] == [out.name]  # no run folder


# --- kill -9 during a hot reload ----------------------------------------------------------------

DEPLOY_CHILD = """
import importlib.util, json, os, signal, sys
sys.path.insert(0, {repo!r})
kill_at, argv = int(sys.argv[1]), sys.argv[2:]
spec = importlib.util.spec_from_file_location("deploy_tool", {tool!r})
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)
from retrieval.artifacts import publish_deployment  # what main imports: only the publication's steps count
import keras  # the check before the switch loads the model: its imports are not the deploy's steps
from retrieval.serving import load_deployment
steps = []
def hook(event, args):
    if event.startswith({prefixes!r}):
        steps.append([event, str(args[0]) if args else ""])
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
code = tool.main(argv)
print(json.dumps(steps))
sys.exit(code)
"""


def run_deploy(
    server: ForkServer, version: tuple[Path, Path, str], root: Path, kill_at: int
) -> subprocess.CompletedProcess[str]:
    """``tools/deploy.py --model M --index I --root ROOT`` in a child process (forked by ``server``)
    that SIGKILLs itself at the ``kill_at``-th file-system step of the publication (0: never; it
    then prints the steps, ``[event, first argument]``, as JSON on its last line)."""
    child = DEPLOY_CHILD.format(
        repo=str(REPO_ROOT), tool=str(REPO_ROOT / "tools" / "deploy.py"), prefixes=FS_EVENTS
    )
    model_dir, index_dir, _ = version
    argv = [str(kill_at), "--model", str(model_dir), "--index", str(index_dir), "--root", str(root)]
    return server.run(child, *argv, timeout=120)


@pytest.fixture(scope="module")
def deploy_steps(
    fork_server: ForkServer,
    model_versions: list[tuple[Path, Path, str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[list[str]], int]:
    """A whole publication's file-system steps (``[event, first argument]``), where the kills
    below are drawn from, and the (1-based) step of its switch: the rename of the new ``current``
    link over the old one (killed at that step, the rename has not happened: audit hooks run
    before the call). One dry run for the three seeds: the steps depend on the tool, not on them."""
    from retrieval.artifacts.deployment import publish_deployment

    calibration = tmp_path_factory.mktemp("calibration") / "live"
    publish_deployment(model_versions[0][0], model_versions[0][1], calibration)
    dry = run_deploy(fork_server, model_versions[1], calibration, 0)
    assert dry.returncode == 0, dry.stderr[-2000:]
    events = json.loads(dry.stdout.splitlines()[-1])
    switch = next(
        i for i, (event, arg) in enumerate(events, 1) if event == "os.rename" and ".current.tmp-" in arg
    )
    assert switch < len(events)
    return events, switch


@pytest.mark.slow  # a server under load while four deploys are killed: ~4 s each (40 s unforked)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_during_a_hot_reload_keeps_serving(
    fork_server: ForkServer,
    model_versions: list[tuple[Path, Path, str]],
    deploy_steps: tuple[list[list[str]], int],
    tmp_path: Path,
    seed: int,
) -> None:
    """A server watches a root under load while ``tools/deploy.py`` is killed at random steps of
    publishing the other version: no call fails, the server serves the version ``current`` names
    (the old one unless the kill came after the switch, then the new one whole), no version is
    refused (none half-written was ever current), and a later whole publication is picked up."""
    from retrieval.artifacts.deployment import deployment_dirs, publish_deployment

    by_version = {v[2]: v for v in model_versions}
    root = tmp_path / "live"
    publish_deployment(model_versions[0][0], model_versions[0][1], root)
    events, switch = deploy_steps
    steps = len(events)
    rng = np.random.default_rng(seed)
    # Three kills anywhere up to the switch, one in the clean-up after it, in a random order.
    kills = [*rng.integers(1, switch + 1, size=3), rng.integers(switch + 1, steps + 1)]
    outcomes = []
    with ReloadUnderLoad(root, callers=3, retries=0) as live:  # no retries: every failure shows
        for kill_at in map(int, rng.permutation(kills)):
            old = read_manifest(deployment_dirs(root)[0], "model")["version"]
            new = next(v for v in by_version if v != old)
            done = run_deploy(fork_server, by_version[new], root, kill_at)
            assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
            model_dir, index_dir = deployment_dirs(root)  # whole: every checksum verifies
            current = read_manifest(model_dir, "model")["version"]
            assert read_manifest(index_dir, "index")["model_version"] == current
            assert current in (old, new)
            time.sleep(0.3)  # several polls of the watcher
            live.settles_on(current)
            assert (current == new) == (kill_at > switch)
            step = f"{events[kill_at - 1][0]} {Path(events[kill_at - 1][1]).name}"
            outcomes.append(
                f"step {kill_at}/{steps} ({step}): {'old kept' if current == old else 'new, whole'}"
            )
        assert live.watcher.refused == 0
        # A whole publication, by the unmodified tool, is picked up.
        old = live.slot.current.model_version
        new = next(v for v in by_version if v != old)
        model_dir, index_dir, _ = by_version[new]
        assert (
            run_tool("deploy", "--model", str(model_dir), "--index", str(index_dir), "--root", str(root)) == 0
        )
        live.settles_on(new)
    print(f"seed {seed}: {'; '.join(outcomes)}; then {old} -> {new}; {len(live.seen)} calls answered")
    assert not live.errors, live.errors[:3]
    assert set(live.seen) == set(by_version)
    assert live.watcher.refused == 0
