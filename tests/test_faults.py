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
import errno
import gc
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval import artifacts
from retrieval.artifacts import (
    ArtifactError,
    contained_file,
    publish,
    read_manifest,
    remove_stale_temporaries,
    resolve_current,
    sha256_file,
    write_artifact,
)
from retrieval.index_artifact import build_index_from_model, load_index, save_index
from retrieval.model_artifact import load_model
from retrieval.retriever import Retriever
from retrieval.vocab import ItemVocab
from tests.conftest import REPO_ROOT, run_tool

FILE_KINDS = {
    "config.json", "vocab.json", "item_attributes.json", "side_vocab.json", "item_embeddings.npy",
    "model.keras", "metrics.json", "user_tower/saved_model.pb", "user_tower/fingerprint.pb",
    "user_tower/variables/variables.index", "user_tower/variables/variables.data-00000-of-00001",
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
        manifest["version"] = artifacts.derived_version(manifest["files"])  # index versions are derived
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
    assert model.encode([np.array([1, 2, 3])]).shape == (1, 1, 16)


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
    # (the field is then missing, which changes nothing); flips that keep the content are skipped.
    model_dir, index_dir = copy(trained[0], tmp_path), trained[1]
    original = (model_dir / "manifest.json").read_bytes()
    refused = tried = 0
    for at, flipped in flips(original):
        tried += 1
        if harmless(original, flipped, {"created"}, {"created", "data", "fusion", "inputs", "side_features"}):
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
        ("dim", {}, {"dim": 17}, "dimension 16, the manifest says 17"),
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
        monkeypatch.setattr(artifacts.os, "fsync", enospc)
    elif step == "exchange":
        monkeypatch.setattr(artifacts, "_exchange", enospc)
    else:  # no atomic exchange: the second of the two renames fails, the first is undone
        real_rename = os.rename
        calls: list[str] = []

        def rename(src: Any, dst: Any) -> None:
            calls.append(f"{Path(src).name} -> {Path(dst).name}")
            if len(calls) == 2:
                enospc()
            real_rename(src, dst)

        monkeypatch.setattr(artifacts, "_exchange", lambda a, b: False)
        monkeypatch.setattr(artifacts.os, "rename", rename)
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
        from retrieval.index_artifact import save_index
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
    assert "File too large" in result.stdout, result.stdout + result.stderr
    assert load_index(out)[1]["model_version"] == "model-v1"
    assert sorted(p.name for p in out.parent.iterdir()) == ["index"]


# --- kill -9 ------------------------------------------------------------------------------------


class FakeModel:
    """A model artifact without TensorFlow: n random items of dimension 32, K = 1."""

    @staticmethod
    def make(n: int, version: str) -> Any:
        from retrieval.model_artifact import ModelArtifact

        table = np.random.default_rng(0).normal(size=(n + 1, 32)).astype(np.float32)
        table[0] = 0

        def user_vectors(inputs: dict[str, np.ndarray]) -> np.ndarray:
            return np.asarray(table[inputs["items"]].mean(axis=1, keepdims=True))

        vocab = ItemVocab.from_ids([f"i{j}" for j in range(n)])
        return ModelArtifact(
            None, {"version": version, "max_len": 8, "num_interests": 1}, vocab, table, user_vectors
        )


BUILD_INDEX_CHILD = """
import sys
sys.path.insert(0, {repo!r})
import retrieval.model_artifact
from tests.test_faults import FakeModel
retrieval.model_artifact.load_model = lambda path, verify=True: FakeModel.make({n}, {version!r})
from tests.conftest import run_tool
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
    arguments to replace it with one of "model-v2", and the folder its temporary folder goes to."""
    old_model = FakeModel.make(2000, "model-v1")
    out = tmp_path / "index"
    if mode == "folder":
        save_index(build_index_from_model(old_model), out, old_model)
        return out, ["--model", "m", "--out", str(out), "--overwrite", "--num-users", "20"], tmp_path
    publish(out, lambda folder: save_index(build_index_from_model(old_model), folder, old_model))
    return out, ["--model", "m", "--out", str(out), "--publish", "--num-users", "20"], out / "versions"


@pytest.fixture(scope="module")
def write_seconds(tmp_path_factory: pytest.TempPathFactory) -> float:
    """How long the tool's temporary folder exists (index written, hashed, synced, renamed)."""
    _, argv, watch = start_state(tmp_path_factory.mktemp("calibrate"), "folder")
    return run_killed(argv, watch, None, "model-v2")[1]


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
from retrieval.artifacts import publish, write_artifact
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


@pytest.mark.parametrize("mode", ["folder", "published root"])
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
