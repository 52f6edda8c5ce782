"""The soak: two versions of a model, the first served by ``tools/serve.py --watch``, a fixed rate
held at a fraction of the server's measured max QPS, the second published halfway."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from subprocess import PIPE
from typing import Any

import grpc

from bench.data import REPO, dataset_file
from bench.robustness.calls import SERVICE
from bench.robustness.processes import (
    model_version_of,
    rss_kb,
    run_tool_process,
    start_watching_server,
    stop_server,
    tool_command,
    tool_env,
)
from bench.robustness.soak_report import RSS_GROWTH_LIMIT, SoakTrace, soak_table, summarise_soak
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving import Engine

log = logging.getLogger("bench.robustness")


@dataclass(frozen=True)
class Version:
    """A model artifact, the index built from it, and the model's version."""

    model: Path
    index: Path
    version: str


def build_versions(
    out: Path, data: Path, train_args: Sequence[str], seeds: Sequence[int] = (1, 2)
) -> list[Version]:
    """One model per seed (``tools/train.py --data DATA TRAIN_ARGS --seed S``) and its Flat index
    (``tools/build_index.py``), built in child processes under ``out`` once, then reused."""
    from retrieval.storage import read_manifest

    name = "-".join([data.stem, *(a.lstrip("-") for a in train_args)])
    built = []
    for seed_value in seeds:
        folder = out / name / f"seed{seed_value}"
        model_dir, index_dir = folder / "model", folder / "index"
        if not (model_dir / "manifest.json").is_file():
            log.info("training %s (seed %d)", model_dir, seed_value)
            run_tool_process(
                "train", "--data", str(data), "--out", str(model_dir), "--seed", str(seed_value),
                "--overwrite", "--quiet", *train_args,
            )  # fmt: skip
        if not (index_dir / "manifest.json").is_file():
            run_tool_process("build_index", "--model", str(model_dir), "--out", str(index_dir), "--overwrite")
        built.append(
            Version(model_dir, index_dir, str(read_manifest(model_dir, "model", verify=False)["version"]))
        )
    if len({v.version for v in built}) != len(built):
        raise RuntimeError(f"the models under {out / name} share a version: a reload would change nothing")
    return built


async def hold_rate(
    address: str,
    batch: Sequence[retrieval_pb2.RetrieveRequest],
    rate: float,
    seconds: float,
    pid: int,
    reload_at: float | None = None,
    reload_command: Sequence[str] = (),
    workers: int = 64,
    timeout: float = 10.0,
    rss_every: float = 1.0,
) -> SoakTrace:
    """Sends ``rate`` Retrieve calls per second for ``seconds`` on a fixed schedule (call ``i`` is
    due at ``i / rate``), runs ``reload_command`` at ``reload_at`` seconds, and samples the
    resident memory of process ``pid`` every ``rss_every`` seconds.

    At most ``workers`` calls are in flight; a call that cannot be sent when due is sent as soon
    as a worker is free, so a server that falls behind shows as send lag, not as a lower rate.
    """
    trace = SoakTrace(seconds=seconds)
    counter = iter(range(1 << 62))
    async with grpc.aio.insecure_channel(address) as channel:
        retrieve = channel.unary_unary(
            SERVICE + "Retrieve",
            retrieval_pb2.RetrieveRequest.SerializeToString,
            retrieval_pb2.RetrieveResponse.FromString,
        )
        start = time.perf_counter()

        async def worker() -> None:
            while True:
                i = next(counter)
                due = i / rate
                if due >= seconds:
                    return
                delay = start + due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                sent = time.perf_counter()
                try:
                    response = await retrieve(batch[i % len(batch)], timeout=timeout)
                    code, version = "OK", str(response.model_version)
                except grpc.aio.AioRpcError as error:
                    code, version = error.code().name, ""
                done = time.perf_counter()
                trace.calls.append((due, sent - start, done - sent, code, version))

        await asyncio.gather(
            *(worker() for _ in range(workers)),
            _sample_rss(trace, start, pid, rss_every),
            _reload(trace, start, reload_at, reload_command),
        )
    return trace


async def _sample_rss(trace: SoakTrace, start: float, pid: int, every: float) -> None:
    """Appends ``(seconds, KiB)`` of process ``pid`` to ``trace.rss`` every ``every`` seconds of
    the run, and once at its end."""
    while (now := time.perf_counter() - start) < trace.seconds:
        trace.rss.append((now, rss_kb(pid)))
        await asyncio.sleep(every)
    trace.rss.append((time.perf_counter() - start, rss_kb(pid)))


async def _reload(trace: SoakTrace, start: float, at: float | None, command: Sequence[str]) -> None:
    """Runs ``command`` (the deploy) ``at`` seconds into the run; its times, exit code and output
    go to ``trace.deploy``."""
    if at is None:
        return
    await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
    began = time.perf_counter() - start
    process = await asyncio.create_subprocess_exec(
        *command, cwd=REPO, env=tool_env(), stdout=PIPE, stderr=PIPE
    )
    stdout, stderr = await process.communicate()
    trace.deploy = {
        "start_s": round(began, 3),
        "end_s": round(time.perf_counter() - start, 3),
        "returncode": process.returncode,
        "stdout": stdout.decode().strip(),
        "stderr": stderr.decode()[-2000:],
    }


def run_soak(
    versions: Sequence[Version],
    batch: Sequence[retrieval_pb2.RetrieveRequest],
    seconds: float,
    out: Path,
    load_fraction: float = 0.8,
    probe_seconds: float = 4.0,
    probe_concurrency: int = 32,
    windows: int = 10,
    watch_interval: float = 1.0,
    rss_limit: float = RSS_GROWTH_LIMIT,
    reload_at: float = 0.5,
    engine: Engine = "python",
) -> dict[str, Any]:
    """Serves ``versions[0]`` from a fresh deployment root under ``out`` with ``tools/serve.py
    --watch --engine ENGINE`` in a child process, measures its max QPS (``probe_concurrency`` calls in flight
    for ``probe_seconds``, after a 1 s warm-up), then holds ``load_fraction`` of it for
    ``seconds`` while ``tools/deploy.py`` publishes ``versions[1]`` at ``reload_at`` of the run
    (halfway by default; short runs publish earlier, so that the swap finishes within the run
    even on a busy machine).

    Returns:
        The run's settings, the probe, :func:`~bench.robustness.soak_report.summarise_soak`'s
        figures and checks, and the server's reload log lines.
    """
    from bench.serving import load

    old, new = versions[0], versions[1]
    out.mkdir(parents=True, exist_ok=True)
    root = out / "soak-root"
    shutil.rmtree(root, ignore_errors=True)
    run_tool_process("deploy", "--model", str(old.model), "--index", str(old.index), "--root", str(root))
    server_log = out / "soak-server.log"
    server, address = start_watching_server(root, server_log, watch_interval, engine=engine)
    try:
        rss_loaded = rss_kb(server.pid)
        probe = asyncio.run(load(address, batch, probe_concurrency, probe_seconds, 10**7))
        rate = load_fraction * probe["qps"]
        log.info("max QPS %.0f at concurrency %d: holding %.0f QPS for %.0f s", probe["qps"],
                 probe_concurrency, rate, seconds)  # fmt: skip
        deploy = tool_command(
            "deploy", "--model", str(new.model), "--index", str(new.index), "--root", str(root)
        )
        trace = asyncio.run(hold_rate(address, batch, rate, seconds, server.pid, seconds * reload_at, deploy))
        alive = server.poll() is None
        final_version = model_version_of(address, timeout=30) if alive else None
    finally:
        stop_server(server)
    summary = summarise_soak(trace, old.version, new.version, windows, rss_limit)
    summary["checks"]["server_alive"] = alive
    summary["checks"]["serves_new_at_end"] = final_version == new.version
    reloads = [
        line
        for line in server_log.read_text(errors="replace").splitlines()
        if "serving model" in line or "refused" in line
    ]
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "engine": engine,
        "seconds": seconds,
        "load_fraction": load_fraction,
        "probe": probe,
        "target_qps": round(rate, 1),
        "requests_per_call": {"k": batch[0].k, "distinct_histories": len(batch)},
        "rss_after_load_mb": round(rss_loaded / 1024, 1),
        "server_exit_code": server.returncode,
        "deploy": trace.deploy,
        "server_reload_log": reloads,
        "rss_samples_mb": [[round(t, 1), round(kb / 1024, 1)] for t, kb in trace.rss],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        **summary,
    }


def soak_versions(args: argparse.Namespace) -> tuple[Path, list[str], list[Version]]:
    """What every robustness run starts with: logging on, then the data file, the training
    arguments and the versions trained from them (:func:`build_versions`, reused when built)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    data = args.soak_data or dataset_file("ml100k", args.data_root)
    train_args = ["--model", args.soak_tower, "--epochs", str(args.soak_epochs)]
    return data, train_args, build_versions(args.out / "soak-versions", data, train_args)


def soak_main(args: argparse.Namespace) -> int:
    """``--soak``: builds (or reuses) two versions, runs :func:`run_soak`, prints and saves it."""
    from bench.serving import requests

    data, train_args, versions = soak_versions(args)
    batch = requests(data, args.k)
    result = run_soak(
        versions,
        batch,
        args.soak,
        args.out,
        args.load_fraction,
        args.probe_seconds,
        args.probe_concurrency,
        engine=args.engine,
    )
    result["command"] = "python -m bench.robustness " + " ".join(sys.argv[1:])
    result["data"] = str(data)
    result["train_args"] = train_args
    text = soak_table(result)
    stem = f"soak-{args.soak:g}s" + ("" if args.engine == "python" else f"-{args.engine}")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    print(f"written to {args.out / stem}.json and .md")
    return 0 if all(result["checks"].values()) else 1
