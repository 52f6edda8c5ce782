"""Abuse cases of deploys and hot reload (``python -m bench.robustness --deploys``).

Versions that pass every checksum but cannot serve, made from a good one (:func:`nan_embeddings`,
:func:`nan_index`, :func:`broken_tower`), go through ``tools/deploy.py`` while ``tools/serve.py
--watch`` serves the deployment root in a child process; a broken version published without the
deploy's check (as an older ``mitt deploy`` did) then meets the running server and a restart; a
version is published between a server's load and its watcher's start; and ``tools/add_items.py``
and ``tools/deploy.py`` write one root at the same time (:func:`concurrent_writers`).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from bench.data import REPO
from bench.robustness.processes import start_watching_server, stop_server, tool_command, tool_env
from bench.robustness.server import create_engine_server
from bench.robustness.soak import Version, soak_versions
from retrieval.api import RetrievalClient
from retrieval.serving import Engine
from retrieval.storage import MANIFEST, sha256_file

log = logging.getLogger("bench.robustness")

WATCH_INTERVAL = 0.2
"""Seconds between the watching servers' polls."""


@dataclass(frozen=True)
class Case:
    """One abuse case: what was done, the figures measured, whether every check held."""

    name: str
    figures: str
    passed: bool


def report_cases(cases: Sequence[Case], started: float) -> int:
    """Prints a row per case and how many passed since ``started`` (``time.monotonic()``);
    returns the exit code: 1 if a case failed."""
    print("| case | figures | passed |\n|---|---|---|")
    for case in cases:
        print(f"| {case.name} | {case.figures} | {'yes' if case.passed else 'NO'} |")
    print(f"{sum(c.passed for c in cases)}/{len(cases)} passed in {time.monotonic() - started:.0f} s")
    return 0 if all(c.passed for c in cases) else 1


def resign(folder: Path) -> Path:
    """Rewrites the checksums in ``folder``'s manifest for its files as they are now, keeping its
    version: what a forged (or buggy) artifact looks like to every checksum. Returns ``folder``."""
    manifest_path = folder / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"] = {name: sha256_file(folder / name) for name in manifest["files"]}
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return folder


def nan_embeddings(model_dir: Path, out: Path) -> Path:
    """A copy of the model ``model_dir`` at ``out`` whose first item's embedding is NaN, re-signed."""
    shutil.copytree(model_dir, out)
    table = out / "item_embeddings.npy"
    embeddings = np.load(table)
    embeddings[1] = np.nan
    np.save(table, embeddings)
    return resign(out)


def broken_tower(model_dir: Path, out: Path) -> Path:
    """A copy of the model ``model_dir`` at ``out`` whose user tower is not a SavedModel, re-signed."""
    shutil.copytree(model_dir, out)
    graph = out / "user_tower" / "saved_model.pb"
    graph.unlink()
    graph.write_bytes(b"not a SavedModel")
    return resign(out)


def nan_index(model_dir: Path, out: Path) -> Path:
    """A Flat index artifact at ``out`` for the model ``model_dir`` whose first item's vector is
    NaN: written by the library, so its manifest and version are in order."""
    from index import FaissIndex
    from retrieval.artifacts import save_index
    from retrieval.storage import read_manifest

    vectors = np.load(model_dir / "item_embeddings.npy")[1:].copy()
    vectors[0] = np.nan
    index = FaissIndex.build(np.arange(1, len(vectors) + 1), vectors, "Flat")
    save_index(index, out, str(read_manifest(model_dir, "model")["version"]))
    return out


def forged_vectors(model_dir: Path, out: Path, vectors: np.ndarray) -> tuple[Path, Path]:
    """A copy of the model ``model_dir`` at ``out/model`` whose item vectors are ``vectors``
    (float32 ``[items, d]``), re-signed, and a Flat index of them at ``out/index`` built from
    it: finite vectors, every checksum and version in order. Returns ``(model, index)``."""
    from index import FaissIndex
    from retrieval.artifacts import save_index
    from retrieval.storage import read_manifest

    model = out / "model"
    shutil.copytree(model_dir, model)
    table = model / "item_embeddings.npy"
    embeddings = np.load(table)
    embeddings[1:] = vectors
    np.save(table, embeddings)
    resign(model)
    index = FaissIndex.build(np.arange(1, len(vectors) + 1), np.asarray(vectors, np.float32), "Flat")
    save_index(index, out / "index", str(read_manifest(model, "model")["version"]))
    return model, out / "index"


def deploy(model_dir: Path, index_dir: Path, root: Path) -> subprocess.CompletedProcess[str]:
    """``tools/deploy.py --model M --index I --root ROOT`` in a child process, as users run it."""
    command = tool_command(
        "deploy", "--model", str(model_dir), "--index", str(index_dir), "--root", str(root)
    )
    return subprocess.run(command, cwd=REPO, env=tool_env(), capture_output=True, text=True)


def refused_deploys(versions: Sequence[Version], work: Path, engine: Engine) -> list[Case]:
    """Serves ``versions[0]`` from a root under ``work`` (a watching child server of ``engine``), deploys a
    NaN-embeddings, a NaN-index and a broken-tower copy of ``versions[1]``, each of which must be
    refused (exit code 2, one line on stderr, ``current`` unchanged) while the server keeps
    answering with ``versions[0]``; then publishes the broken one without the check: the server
    must refuse it too (counted in ``GetModelInfo``), and a restart must start on the older version."""
    from retrieval.artifacts import publish_deployment, read_model_vocab

    good, other = versions[0], versions[1]
    root = work / "root"
    if deploy(good.model, good.index, root).returncode != 0:
        raise RuntimeError(f"tools/deploy.py refused the good version {good.model}")
    history = list(read_model_vocab(good.model).ids[:3])
    forged: dict[str, tuple[Path, Path]] = {
        "NaN embeddings": (nan_embeddings(other.model, work / "nan-model"), other.index),
        "NaN index": (other.model, nan_index(other.model, work / "nan-index")),
        "broken tower": (broken_tower(other.model, work / "broken-model"), other.index),
    }
    cases = []
    server, address = start_watching_server(root, work / "server.log", WATCH_INTERVAL, engine=engine)
    try:
        with RetrievalClient(address, timeout=30) as client:
            for name, (model_dir, index_dir) in forged.items():
                current = (root / "current").resolve()
                started = time.monotonic()
                done = deploy(model_dir, index_dir, root)
                seconds = time.monotonic() - started
                error = done.stderr.strip().splitlines()
                answered = client.retrieve(history, k=5).model_version
                cases.append(
                    Case(
                        f"deploy {name}",
                        f"exit {done.returncode} in {seconds:.1f} s; {error[-1] if error else 'no error'}; "
                        f"server answers {answered}",
                        done.returncode == 2
                        and len(error) == 1
                        and (root / "current").resolve() == current
                        and answered == good.version,
                    )
                )
            publish_deployment(*forged["broken tower"], root)  # no check: what an older deploy did
            deadline = time.monotonic() + 60
            while client.model_info().reload_refusals < 1 and time.monotonic() < deadline:
                time.sleep(WATCH_INTERVAL)
            info = client.model_info()
            answered = client.retrieve(history, k=5).model_version
            cases.append(
                Case(
                    "unchecked broken version, running server",
                    f"reload_refusals {info.reload_refusals}; server answers {answered}",
                    info.reload_refusals == 1 and answered == good.version,
                )
            )
    finally:
        stop_server(server)
    cases.append(restart(root, work / "restart.log", good, history, engine))
    return cases


def restart(root: Path, log_file: Path, expected: Version, history: list[str], engine: Engine) -> Case:
    """Starts a watching server of ``engine`` on ``root``, whose current version does not load: it
    must start, serve ``expected`` and log an ERROR line naming both versions."""
    started = time.monotonic()
    server, address = start_watching_server(root, log_file, WATCH_INTERVAL, engine=engine)
    try:
        seconds = time.monotonic() - started
        with RetrievalClient(address, timeout=30) as client:
            answered = client.retrieve(history, k=5).model_version
            info = client.model_info()
    finally:
        stop_server(server)
    refused = (root / "current").resolve().name
    errors = [line for line in log_file.read_text(errors="replace").splitlines() if " ERROR " in line]
    named = any(refused in line and expected.version in line for line in errors)
    return Case(
        "restart on an unchecked broken version",
        f"started in {seconds:.1f} s; serves {answered}; reload_refusals {info.reload_refusals}; "
        f"ERROR line naming both: {named}",
        answered == expected.version and info.reload_refusals == 1 and named,
    )


def start_during_publish(versions: Sequence[Version], work: Path, engine: Engine, max_polls: int = 2) -> Case:
    """Loads ``versions[0]`` as ``mitt serve --watch`` does and serves it with ``engine``, publishes
    ``versions[1]`` before the watcher starts, then polls: the new version must be served within
    ``max_polls`` polls."""
    from retrieval.artifacts import publish_deployment
    from retrieval.serving import DeploymentWatcher, ServerConfig, open_deployment

    old, new = versions[0], versions[1]
    root = work / "start-root"
    publish_deployment(old.model, old.index, root)
    slot = open_deployment(root)  # the server's load
    publish_deployment(new.model, new.index, root)  # lands before its watcher starts
    server, port = create_engine_server(slot, ServerConfig(port=0, search_threads=None, engine=engine))
    try:
        watcher = DeploymentWatcher(root, slot, WATCH_INTERVAL)
        polls = 0
        while slot.current.model_version != new.version and polls < max_polls + 3:
            polls += 1
            watcher.check()
        with RetrievalClient(f"127.0.0.1:{port}", timeout=30) as client:
            answered = client.model_info().model_version
    finally:
        server.stop(None)
    return Case(
        "publish during start",
        f"served {answered} after {polls} poll(s) (published {old.version} -> {new.version})",
        answered == new.version and polls <= max_polls,
    )


def concurrent_writers(versions: Sequence[Version], work: Path, changes: int = 6) -> Case:
    """Publishes ``versions[0]`` to a root, then starts ``tools/deploy.py`` of ``versions[1]`` and,
    0.1 s apart, ``changes`` ``tools/add_items.py --remove`` each taking out another item, all
    child processes writing that root at once. Every writer must exit 0; in the order of their
    version names, each add-items version's model must name the previous version's as the one
    it changed (published over the version it read), ``current`` must be the last, and every
    removal published after the deploy must be in it (those published before it changed the
    older model, which the deploy replaces, as any deploy does)."""
    from retrieval.artifacts import publish_deployment, read_model_vocab

    root = work / "writers-root"
    publish_deployment(versions[0].model, versions[0].index, root)
    keep = ("--keep", str(changes + 2))  # every version stays for the checks
    new = versions[1]
    started = time.monotonic()
    writers = {
        "deploy": _start(
            "deploy", "--model", str(new.model), "--index", str(new.index), "--root", str(root), *keep
        )
    }
    for item in read_model_vocab(versions[0].model).ids[10 : 10 + changes]:
        time.sleep(0.1)
        (work / f"remove-{item}.txt").write_text(item + "\n")
        writers[item] = _start(
            "add_items", "--root", str(root), "--remove", str(work / f"remove-{item}.txt"), *keep
        )
    outputs = {name: (*process.communicate(), process.returncode) for name, process in writers.items()}
    seconds = time.monotonic() - started
    failed = [f"{name} exit {code}: {err.strip()[-300:]}" for name, (_, err, code) in outputs.items() if code]
    # Each tool prints its version folder first.
    published = {
        Path(out.split(":")[0].strip()).name: name for name, (out, _, code) in outputs.items() if not code
    }
    chained, after, removed = _publication_order(root, published)
    waited = sum("waiting for another writer" in err for _, err, _ in outputs.values())
    return Case(
        "add-items and deploy at once",
        f"{len(published)}/{len(writers)} writers exit 0 in {seconds:.1f} s ({changes} add-items, 1 deploy), "
        f"{waited} waited for the lock; each version over the one before: {chained}; removals published "
        f"after the deploy: {len(after)}, in current: {len(after & removed)}"
        + (f"; {failed}" if failed else ""),
        not failed and chained and removed == after,
    )


def _start(name: str, *args: str) -> subprocess.Popen[str]:
    """``tools/<name>.py ARGS`` started in a child process, its output piped."""
    return subprocess.Popen(
        tool_command(name, *args),
        cwd=REPO,
        env=tool_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _publication_order(root: Path, published: dict[str, str]) -> tuple[bool, set[str], set[str]]:
    """Given version folder name -> writer (``"deploy"`` or the item an add-items removed):
    whether ``current`` is the last version and each add-items version changed the version
    before it (version names sort in publication order), the items removed after the last
    deploy, and the items ``current`` has removed."""
    from retrieval.artifacts import load_catalogue
    from retrieval.storage import read_manifest, resolve_current

    order = sorted(published)
    models = {
        name: read_manifest(root / "versions" / name / "model", "model", verify=False) for name in order
    }
    current = resolve_current(root)
    chained = (
        bool(order)
        and current.name == order[-1]
        and all(
            published[later] == "deploy" or models[later]["previous_version"] == models[earlier]["version"]
            for earlier, later in pairwise(order)
        )
    )
    deploys = [n for n, name in enumerate(order) if published[name] == "deploy"]
    after = {published[name] for name in order[deploys[-1] + 1 if deploys else 0 :]}
    catalogue = load_catalogue(current / "model", read_manifest(current / "model", "model", verify=False))
    removed = set(catalogue.vocab.external(catalogue.removed)) if len(catalogue.removed) else set()
    return chained, after, removed


def run_deploys(versions: Sequence[Version], out: Path, engine: Engine = "python") -> list[Case]:
    """Every case, its servers of ``engine``, in a fresh folder ``out/deploys``."""
    work = out / "deploys"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return [
        *refused_deploys(versions, work, engine),
        start_during_publish(versions, work, engine),
        concurrent_writers(versions, work),
    ]


def deploys_main(args: argparse.Namespace) -> int:
    """``--deploys``: builds (or reuses) the soak's two versions, runs every case, prints a row
    per case; exits 1 if one fails."""
    _, _, versions = soak_versions(args)
    started = time.monotonic()
    return report_cases(run_deploys(versions, args.out, args.engine), started)
