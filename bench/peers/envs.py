"""The peers' own virtual environments: what each one installs, how, and how its runner is run.

Each peer is installed into a venv of its own under the cache (never into the project's) and runs
its own model code and training loop in its own process: ``runners/<peer>_runner.py``, a
standalone script started by its file path with the venv's Python. It imports nothing of the
project, and its folder holds nothing else, so nothing of ours can shadow a module of the peer's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.peers.plan import ModelRun, Settings

RUNNERS = Path(__file__).resolve().parent / "runners"
"""The runner scripts (``<peer>_runner.py``), run in the peers' venvs."""
DEFAULT_CACHE = Path.home() / ".cache" / "mitt-peers"
TORCH_WHEEL_GLOB = "torch-2.13.0+cpu-cp311-cp311-*.whl"
WHEEL_DIRS = (Path("/opt/wheels"),)
"""Where a local CPU build of torch is looked for when ``--torch-wheel`` is not given (also every
folder of ``PIP_FIND_LINKS``)."""


@dataclass(frozen=True)
class PeerEnv:
    """How one peer library is installed and run.

    Attributes:
        name: the peer (``recbole``, ``deepmatch``); also its venv folder under the cache.
        runner: the script under ``bench/peers/runners/`` run with the venv's Python.
        requirements: installed together, with dependencies.
        no_deps: installed afterwards with ``--no-deps`` (packages whose declared dependencies
            would pull a second, larger build of something already there).
        env: environment variables every run of the runner gets.
    """

    name: str
    runner: str
    requirements: tuple[str, ...]
    no_deps: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


PEER_ENVS = {
    "recbole": PeerEnv(
        "recbole",
        "recbole_runner.py",
        ("torch==2.13.0", "recbole==1.2.1", "numpy<2", "pandas<3", "setuptools<81"),
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
    ),
    "deepmatch": PeerEnv(
        "deepmatch",
        "deepmatch_runner.py",
        ("tensorflow-cpu==2.21.0", "deepmatch==0.3.2"),
        # tf-keras depends on `tensorflow` by name: with its deps it would add the 572 MB build.
        no_deps=("tf-keras==2.21.0",),
        env={"TF_USE_LEGACY_KERAS": "1"},
    ),
}


def find_torch_wheel(given: Path | None = None) -> Path | None:
    """The local torch CPU wheel: ``given`` if set, else the first match in :data:`WHEEL_DIRS`
    and ``PIP_FIND_LINKS``; ``None`` when there is none (torch then comes from the index)."""
    if given is not None:
        if not given.is_file():
            raise FileNotFoundError(f"--torch-wheel {given}: no such file")
        return given
    folders = [*WHEEL_DIRS, *(Path(p) for p in os.environ.get("PIP_FIND_LINKS", "").split() if p)]
    for folder in folders:
        found = sorted(folder.glob(TORCH_WHEEL_GLOB)) if folder.is_dir() else []
        if found:
            return found[-1]
    return None


def base_python() -> str:
    """The interpreter new venvs are made with: the base Python behind the running one (the
    project's venv Python would do too, but the base one never inherits its packages)."""
    return getattr(sys, "_base_executable", "") or shutil.which("python3") or "python3"


def install_commands(peer: PeerEnv, venv: Path, torch_wheel: Path | None = None) -> list[list[str]]:
    """The commands that create ``venv`` and install ``peer`` into it (a local torch wheel
    replaces the ``torch==`` requirement when given)."""
    python = str(venv / "bin" / "python")
    requirements = [
        str(torch_wheel) if torch_wheel is not None and r.startswith("torch==") else r
        for r in peer.requirements
    ]
    commands = [
        [base_python(), "-m", "venv", str(venv)],
        [python, "-m", "pip", "install", "--quiet", *requirements],
    ]
    if peer.no_deps:
        commands.append([python, "-m", "pip", "install", "--quiet", "--no-deps", *peer.no_deps])
    return commands


def ensure_env(peer: PeerEnv, cache: Path, torch_wheel: Path | None = None) -> dict[str, Any]:
    """Creates ``cache/<peer>`` and installs the peer into it, unless a finished install of the
    same requirements is there already.

    Returns:
        ``{"venv", "python", "installed_now", "install_seconds", "packages"}``; the seconds are
        those of the install that made the venv (read back when it was already there).
    """
    venv = cache / peer.name
    marker = venv / ".mitt-peer.json"
    wanted = {"requirements": list(peer.requirements), "no_deps": list(peer.no_deps)}
    if marker.is_file():
        done = json.loads(marker.read_text())
        if {k: done.get(k) for k in wanted} == wanted:
            return {**done, "venv": str(venv), "python": str(venv / "bin" / "python"), "installed_now": False}
    if venv.exists():
        shutil.rmtree(venv)  # a half-made or outdated venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for command in install_commands(peer, venv, torch_wheel):
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)
    freeze = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze"], check=True, capture_output=True, text=True
    ).stdout.split()
    record = {**wanted, "install_seconds": round(time.perf_counter() - started, 1), "packages": freeze}
    marker.write_text(json.dumps(record, indent=2))
    return {**record, "venv": str(venv), "python": str(venv / "bin" / "python"), "installed_now": True}


def peer_environment(peer: PeerEnv) -> dict[str, str]:
    """The runner's environment: ours, without anything that would let the project or its venv
    leak in, plus the peer's variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **peer.env}


def peer_command(run: ModelRun, python: str, split_dir: Path, export: Path, s: Settings) -> list[str]:
    """The runner's command line for ``run``."""
    peer = PEER_ENVS[run.side]
    command = [
        python,
        str(RUNNERS / peer.runner),
        "--model",
        run.model,
        "--split",
        str(split_dir / "split.json"),
    ]
    command += ["--out", str(export), "--epochs", str(s.epochs), "--batch-size", str(s.batch_size)]
    command += ["--dim", str(s.dim), "--max-len", str(s.max_len), "--seed", str(s.seed)]
    command += ["--max-minutes", str(s.peer_minutes)]
    if run.side == "recbole":
        command += ["--atomic", str(split_dir / "recbole")]
    if run.side == "deepmatch":
        command += ["--interests", str(s.interests), "--negatives", str(s.negatives)]
    return command
