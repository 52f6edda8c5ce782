"""Safe deploys: a version that cannot serve never becomes ``current``, a server (re)starting on a
root whose current version fails serves the newest one that loads, refusals are counted, and a
deploy copies exactly the files the manifests list."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from bench.robustness import broken_tower, nan_embeddings, nan_index, start_watching_server
from bench.robustness.deploys import forged_vectors
from index import FaissIndex
from retrieval.artifacts.deployment import deployment_dirs, publish_deployment
from retrieval.serving.metrics import Metrics
from retrieval.serving.reload import (
    REFUSAL_CHARS,
    DeploymentWatcher,
    check_answers,
    describe_error,
    load_deployment,
    open_deployment,
)
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import create_server
from retrieval.storage.manifest import MANIFEST, ArtifactError, read_manifest
from retrieval.storage.versions import version_folders
from tests.helpers import connected, local, make_model, run_tool, scrape, tiered

Versions = list[tuple[Path, Path, str]]


def deploy(model_dir: Path, index_dir: Path, root: Path) -> int:
    return run_tool("deploy", "--model", str(model_dir), "--index", str(index_dir), "--root", str(root))


@pytest.mark.parametrize(
    "damage", tiered(["nan embeddings", "nan index", "broken tower"], slow={"nan embeddings", "nan index"})
)  # each deploy loads TensorFlow and the model: 4-5 s
def test_deploy_refuses_a_version_that_cannot_serve(
    model_versions: Versions, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """Each damaged version passes every checksum; only loading it finds the damage."""
    (model_1, index_1, v1), (model_2, index_2, _) = model_versions
    root = tmp_path / "live"
    assert deploy(model_1, index_1, root) == 0
    current, versions = (root / "current").resolve(), version_folders(root)
    model_dir, index_dir = {
        "nan embeddings": (nan_embeddings(model_2, tmp_path / "nan-model"), index_2),
        "nan index": (model_2, nan_index(model_2, tmp_path / "nan-index")),
        "broken tower": (broken_tower(model_2, tmp_path / "broken-model"), index_2),
    }[damage]
    capsys.readouterr()
    assert deploy(model_dir, index_dir, root) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and error.startswith(f"error: not published, {root} unchanged")
    expected = {"nan embeddings": "NaN", "nan index": "NaN", "broken tower": "not a readable user tower"}
    assert expected[damage] in error
    assert (root / "current").resolve() == current and version_folders(root) == versions
    assert not [p for p in (root / "versions").iterdir() if p.name.startswith(".")]  # no leftovers
    assert load_deployment(root).model_version == v1  # a restart still starts


@pytest.mark.parametrize("forgery", ["all 3e38", "all one vector"])
def test_deploy_refuses_item_vectors_that_answer_every_user_alike(
    model_versions: Versions, tmp_path: Path, capsys: pytest.CaptureFixture[str], forgery: str
) -> None:
    """Finite vectors, every checksum and version in order, yet useless: every score ties within
    a user (or overflows), so every user gets the same list. Both used to deploy with exit 0."""
    (model_1, index_1, _), (model_2, _, _) = model_versions
    root = tmp_path / "live"
    assert deploy(model_1, index_1, root) == 0
    current = (root / "current").resolve()
    trained = np.load(model_2 / "item_embeddings.npy")[1:]
    vectors = (
        np.full_like(trained, 3e38) if forgery == "all 3e38" else np.repeat(trained[:1], len(trained), 0)
    )
    model_dir, index_dir = forged_vectors(model_2, tmp_path / "forged", vectors)
    capsys.readouterr()
    assert deploy(model_dir, index_dir, root) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and error.startswith(f"error: not published, {root} unchanged")
    assert "the 8 sampled users all get the same items in the same order" in error
    assert (root / "current").resolve() == current


def test_the_check_refuses_interests_that_score_beyond_float32() -> None:
    """Index vectors of ±3e38 are finite, but real interests (of norm ~1 here) score them ±inf
    or NaN; the same model over its own vectors passes (K = 2 interests, 40 items)."""
    model = make_model()
    ids = np.arange(1, len(model.vocab) + 1)
    check_answers(Retriever(model, FaissIndex.build(ids, model.item_embeddings[1:])))
    huge = (np.sign(model.item_embeddings[1:]) * 3e38).astype(np.float32)
    assert np.isfinite(huge).all()
    with pytest.raises(
        ArtifactError, match=r"of the \d+ scores of 8 sampled users' interests are not finite"
    ):
        check_answers(Retriever(model, FaissIndex.build(ids, huge)))


def test_a_start_on_a_broken_current_serves_the_newest_version_that_loads(
    model_versions: Versions, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (model_1, index_1, v1), (model_2, index_2, v2) = model_versions
    root = tmp_path / "live"
    publish_deployment(model_1, index_1, root)
    good = publish_deployment(model_2, index_2, root)
    broken = publish_deployment(broken_tower(model_2, tmp_path / "broken"), index_2, root)  # no check
    with caplog.at_level(logging.WARNING, logger="retrieval.serving.reload"):
        slot = open_deployment(root)
    assert slot.current.model_version == v2 and slot.folder == good.resolve()  # the newest good one
    assert slot.refusals == 1 and "not a readable user tower" in slot.last_refusal
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert broken.name in record.getMessage() and good.name in record.getMessage()
    watcher = DeploymentWatcher(root, slot)
    assert not watcher.check() and watcher.refused == 1  # the refused version is not tried again
    publish_deployment(model_1, index_1, root)
    assert watcher.check() and slot.current.model_version == v1  # the next publication is served


def test_a_start_fails_only_when_no_version_loads(model_versions: Versions, tmp_path: Path) -> None:
    model_1, index_1, _ = model_versions[0]
    root = tmp_path / "live"
    publish_deployment(nan_embeddings(model_1, tmp_path / "nan"), index_1, root)
    with pytest.raises(ArtifactError, match="NaN"):
        open_deployment(root)
    with pytest.raises(ArtifactError, match="not a deployment"):
        open_deployment(tmp_path / "nothing")


def test_refusals_are_counted_in_metrics_and_model_info(model_versions: Versions, tmp_path: Path) -> None:
    (model_1, index_1, v1), (model_2, index_2, _) = model_versions
    root = tmp_path / "live"
    publish_deployment(model_1, index_1, root)
    publish_deployment(nan_embeddings(model_2, tmp_path / "nan"), index_2, root)
    slot = open_deployment(root)  # refuses the NaN version before the server starts
    metrics = Metrics()
    server, port = create_server(slot, local(), metrics=metrics)
    metrics_port = metrics.serve(0)
    try:
        publish_deployment(model_1, nan_index(model_1, tmp_path / "nan-index"), root)
        assert not DeploymentWatcher(root, slot).check()
        with connected(f"127.0.0.1:{port}") as client:
            info = client.model_info()
            assert client.retrieve(list(slot.current.model.vocab.ids[:3]), k=5).model_version == v1
        assert info.model_version == v1 and info.reload_refusals == 2
        assert "NaN or infinite vectors" in info.last_refusal and len(info.last_refusal) <= REFUSAL_CHARS
        assert scrape(metrics_port)[("retrieval_reload_refusals_total", ())] == 2
    finally:
        server.stop(None)
        metrics.close()


def test_refusal_reasons_are_one_short_line() -> None:
    reason = describe_error(RuntimeError("first line\n" + "x" * 1000))
    assert reason.startswith("RuntimeError: first line x") and reason.endswith("...")
    assert len(reason) == REFUSAL_CHARS and "\n" not in reason
    assert describe_error(ArtifactError("a\n  b")) == "a b"  # its message says it all


def test_deploy_copies_exactly_the_listed_files(model_versions: Versions, tmp_path: Path) -> None:
    model_1, index_1, _ = model_versions[0]
    model = tmp_path / "model"
    shutil.copytree(model_1, model)
    (model / "notes.txt").write_text("added after writing")
    (model / "extra").mkdir()
    (model / "extra" / "data.bin").write_bytes(b"\0" * 100)
    (model / "inside").symlink_to(model / "user_tower")  # a link that stays inside is not refused
    assert deploy(model, index_1, tmp_path / "live") == 0
    deployed_model, deployed_index = deployment_dirs(tmp_path / "live")
    for source, deployed, kind in ((model, deployed_model, "model"), (index_1, deployed_index, "index")):
        listed = {MANIFEST, *read_manifest(source, kind)["files"]}
        copied = {p.relative_to(deployed).as_posix() for p in deployed.rglob("*") if not p.is_dir()}
        assert copied == listed


@pytest.mark.parametrize("target", ["outside", "/"])
def test_deploy_refuses_a_symlink_out_of_the_artifact(
    model_versions: Versions, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    model_1, index_1, _ = model_versions[0]
    outside = tmp_path / "outside"
    (outside / "secrets").mkdir(parents=True)
    model = tmp_path / "model"
    shutil.copytree(model_1, model)
    link = model / "user_tower" / "assets" / "escape"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(outside if target == "outside" else Path(target))
    with pytest.raises(ArtifactError, match=r"is a symlink to .*, outside the artifact folder"):
        publish_deployment(model, index_1, tmp_path / "live")
    capsys.readouterr()
    assert deploy(model, index_1, tmp_path / "live") == 2
    assert f"{link} is a symlink to" in capsys.readouterr().err
    assert not (tmp_path / "live" / "current").exists()


def test_a_listed_file_linked_out_of_the_artifact_is_refused(
    model_versions: Versions, tmp_path: Path
) -> None:
    model_1, index_1, _ = model_versions[0]
    model = tmp_path / "model"
    shutil.copytree(model_1, model)
    vocab = model / "vocab.json"
    shutil.move(vocab, tmp_path / "vocab.json")
    os.symlink(tmp_path / "vocab.json", vocab)
    with pytest.raises(ArtifactError, match="outside the artifact"):
        publish_deployment(model, index_1, tmp_path / "live")


@pytest.mark.slow  # a server process starts (TensorFlow, two model loads): ~5 s here
def test_the_serve_tool_restarts_on_a_broken_current(model_versions: Versions, tmp_path: Path) -> None:
    """``mitt serve --watch`` on a root whose current version does not load starts anyway,
    serving the newest good version, says so in an ERROR line, and reports the refusal."""
    (model_1, index_1, v1), (model_2, index_2, _) = model_versions
    root = tmp_path / "live"
    good = publish_deployment(model_1, index_1, root)
    broken = publish_deployment(nan_embeddings(model_2, tmp_path / "nan"), index_2, root)
    log_file = tmp_path / "server.log"
    server, address = start_watching_server(root, log_file, interval=0.2, startup_seconds=120)
    try:
        with connected(address) as client:
            info = client.model_info()
            history = list(load_deployment(good).model.vocab.ids[:3])
            assert client.retrieve(history, k=5).model_version == v1
    finally:
        server.terminate()
        server.wait(30)
    assert info.model_version == v1 and info.reload_refusals == 1 and "NaN" in info.last_refusal
    errors = [line for line in log_file.read_text().splitlines() if " ERROR " in line]
    assert any(broken.name in line and good.name in line for line in errors), errors
    assert (root / "current").resolve() == broken.resolve()  # the server changed nothing on disk
