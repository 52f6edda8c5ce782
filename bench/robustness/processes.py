"""The soak's child processes: the tools run as users run them, the watching server, and what is
read from a running server (its version, its resident memory)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from bench.data import REPO
from bench.robustness.calls import SERVICE
from retrieval.api.v1 import retrieval_pb2
from retrieval.serving import Engine


def tool_env() -> dict[str, str]:
    """A tool's environment: ours (the project is installed in the venv), TensorFlow's C++ logs off."""
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def tool_command(name: str, *args: str) -> list[str]:
    """``python tools/<name>.py ARGS``, run from the repository root as users run it."""
    return [sys.executable, str(REPO / "tools" / f"{name}.py"), *args]


def run_tool_process(name: str, *args: str) -> str:
    """Runs ``tools/<name>.py ARGS`` in a child process, as users run it; returns its stdout.

    Raises:
        RuntimeError: the tool failed (the end of its stderr is in the message).
    """
    done = subprocess.run(
        tool_command(name, *args),
        cwd=REPO,
        env=tool_env(),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"tools/{name}.py {' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}"
        )
    return done.stdout


def rss_kb(pid: int) -> int:
    """The resident set size of process ``pid`` in KiB (``VmRSS`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def model_version_of(address: str, timeout: float = 5.0) -> str:
    """The ``model_version`` a server reports (``GetModelInfo``)."""
    with grpc.insecure_channel(address) as channel:
        info = channel.unary_unary(
            SERVICE + "GetModelInfo",
            retrieval_pb2.GetModelInfoRequest.SerializeToString,
            retrieval_pb2.ModelInfo.FromString,
        )(retrieval_pb2.GetModelInfoRequest(), timeout=timeout)
    return str(info.model_version)


def start_watching_server(
    root: Path, log_file: Path, interval: float, startup_seconds: float = 300.0, engine: Engine = "python"
) -> tuple[subprocess.Popen[bytes], str]:
    """Starts ``tools/serve.py --watch ROOT --engine ENGINE`` on a free port (its log to
    ``log_file``) and waits until it answers; returns the process and its address."""
    from bench.serving import free_port

    port = free_port()
    command = tool_command(
        "serve", "--watch", str(root), "--watch-interval", str(interval), "--port", str(port),
        "--processes", "1",  # one process: the soak reads its resident memory
        "--engine", engine,
    )  # fmt: skip
    with open(log_file, "wb") as log_handle:
        process = subprocess.Popen(
            command, cwd=REPO, env=tool_env(), stdout=log_handle, stderr=subprocess.STDOUT
        )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + startup_seconds
    while True:
        try:
            model_version_of(address)
            return process, address
        except grpc.RpcError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise RuntimeError(
                    f"the server did not start (exit code {process.poll()}); log: {log_file}"
                ) from None
            time.sleep(0.3)


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server's graceful stop), then kill after 30 s."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
