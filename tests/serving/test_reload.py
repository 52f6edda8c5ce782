"""Hot reload: a new deployment version is swapped in under load without a failed request; a
broken one is refused and the old one keeps serving."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from retrieval.artifacts.deployment import INDEX_DIR, MODEL_DIR, deployment_dirs, publish_deployment
from retrieval.serving.metrics import Metrics
from retrieval.serving.reload import DeploymentWatcher, RetrieverSlot, load_deployment
from retrieval.storage.manifest import ArtifactError, read_manifest
from retrieval.storage.versions import publish
from tests.helpers import ReloadUnderLoad, connected, run_tool, scrape
from tools import serve as serve_tool


def test_deploy_refuses_an_index_of_another_model(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    (model_1, index_1, _), (model_2, _, _) = model_versions
    with pytest.raises(ArtifactError, match="was built from model"):
        publish_deployment(model_2, index_1, tmp_path / "live")
    assert (
        run_tool("deploy", "--model", str(model_2), "--index", str(index_1), "--root", str(tmp_path / "live"))
        == 2
    )
    assert (
        run_tool("deploy", "--model", str(model_1), "--index", str(index_1), "--root", str(tmp_path / "live"))
        == 0
    )
    model_dir, index_dir = deployment_dirs(tmp_path / "live")
    assert read_manifest(model_dir, "model")["version"] == model_versions[0][2]  # checksums hold in the copy
    assert read_manifest(index_dir, "index")["model_version"] == model_versions[0][2]
    with pytest.raises(ArtifactError, match="not a deployment"):
        deployment_dirs(tmp_path / "nothing")


def test_swap_under_load_fails_no_request(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    (model_1, index_1, v1), (model_2, index_2, v2) = model_versions
    root = tmp_path / "live"
    publish_deployment(model_1, index_1, root)
    metrics = Metrics()
    metrics_port = metrics.serve(0)
    try:
        with ReloadUnderLoad(root, callers=4, metrics=metrics) as live:
            live.wait_for_calls(4)  # under load before the swap
            publish_deployment(model_2, index_2, root)
            live.settles_on(v2)
            live.stop_calls()
            assert not live.errors
            assert live.slot.current.model_version == v2
            seen = live.seen
            assert seen[0] == v1 and seen[-1] == v2
            first_new = seen.index(v2)
            assert set(seen[first_new + 4 :]) == {v2}  # at most the 4 in flight answered by the old one
            samples = scrape(metrics_port)
            assert samples[("retrieval_model_info", (("model_version", v2),))] == 1
            assert ("retrieval_model_info", (("model_version", v1),)) not in samples

            # A version whose index belongs to another model, and one with a corrupted file: each
            # refused once, and the current one keeps serving.
            def mismatched(folder: Path) -> None:
                folder.mkdir()
                shutil.copytree(model_1, folder / MODEL_DIR)
                shutil.copytree(index_2, folder / INDEX_DIR)

            def corrupted(folder: Path) -> None:
                folder.mkdir()
                shutil.copytree(model_1, folder / MODEL_DIR)
                shutil.copytree(index_1, folder / INDEX_DIR)
                table = folder / MODEL_DIR / "item_embeddings.npy"
                data = bytearray(table.read_bytes())
                data[-1] ^= 0xFF
                table.write_bytes(bytes(data))

            for broken in (mismatched, corrupted):
                refused = live.watcher.refused
                publish(root, broken)
                live.wait_refused(refused + 1)
                with connected(live.address) as client:
                    assert client.retrieve(live.history, k=5).model_version == v2
    finally:
        metrics.close()


def test_a_version_published_while_the_server_starts_is_served_at_the_first_poll(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    """The watcher compares ``current`` with the folder the slot's retriever was loaded from, not
    with what ``current`` named when the watcher was made."""
    (model_1, index_1, v1), (model_2, index_2, v2) = model_versions
    root = tmp_path / "live"
    first = publish_deployment(model_1, index_1, root)
    slot = RetrieverSlot(load_deployment(root))  # the server's load...
    new = publish_deployment(model_2, index_2, root)  # ...a publication before its watcher starts...
    watcher = DeploymentWatcher(root, slot)
    assert slot.folder == first.resolve() and slot.current.model_version == v1
    assert watcher.check()  # ...is loaded at the first poll
    assert slot.folder == new.resolve() and slot.current.model_version == v2
    assert not watcher.check()  # and only once


def test_serve_tool_takes_a_model_and_index_or_a_watched_root() -> None:
    assert serve_tool.parse_args(["--watch", "live"])[0].watch == "live"
    for bad in (["--watch", "live", "--model", "m"], ["--model", "m"], [], ["--watch", "live", "--xla"]):
        with pytest.raises(SystemExit):
            serve_tool.parse_args(bad)
    assert serve_tool.parse_args(["--model", "m", "--index", "i", "--xla"])[0].xla


def test_versions_published_across_a_second_boundary_keep_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version's name is its publication time: read once, or the seconds of one instant and
    the fraction of the next could name a later version before an earlier one."""
    from retrieval.storage.versions import version_folders

    clock = iter([1_796_405_254_999_999_999, 1_796_405_255_000_000_001])
    monkeypatch.setattr("retrieval.storage.versions.time.time_ns", lambda: next(clock))
    first = publish(tmp_path, lambda folder: folder.mkdir(), grace=0)
    second = publish(tmp_path, lambda folder: folder.mkdir(), grace=0)
    assert version_folders(tmp_path) == [first, second]
    assert first.name.startswith("20261204T172734.999999999Z") and second.name.startswith(
        "20261204T172735.000000001Z"
    )
