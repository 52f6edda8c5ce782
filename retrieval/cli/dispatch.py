"""The ``mitt`` command: ``mitt COMMAND [ARGS]`` runs ``retrieval.cli.<module>.main(ARGS)``.

Only the chosen command's module is imported, and only once it is chosen: ``mitt --help``
lists the commands from :data:`COMMANDS` alone, and ``mitt COMMAND --help`` costs what that
command's own parser costs (no TensorFlow, FAISS or pandas: a test checks every command).

A command whose libraries are not installed (``mitt train`` on a client-only install) fails
with one line naming the pip extra that brings them, not a traceback.

Example:
    >>> main(["query", "--history", "50", "172", "--k", "10"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["COMMANDS", "DISTRIBUTION", "Command", "install_hint", "main", "missing_library"]

DISTRIBUTION = "mitt-retrieval"
"""The name pip knows the project by."""

OWN_PACKAGES = frozenset({"retrieval", "towers", "rankers", "index"})
"""Top-level packages of this distribution: a missing module of theirs is a bug, not an extra."""


@dataclass(frozen=True)
class Command:
    """One ``mitt`` command.

    Attributes:
        module: its module under :mod:`retrieval.cli`, whose ``main(argv, prog)`` runs it.
        extra: the pip extra installing what it needs (``client``, ``train``, ``serve``).
        summary: one line for ``mitt --help``: its module docstring's first line (a test checks).
    """

    module: str
    extra: str
    summary: str


COMMANDS: dict[str, Command] = {
    "prepare": Command(
        "prepare",
        "train",
        "Convert interactions into the partitioned Parquet layout that training streams from.",
    ),
    "train": Command("train", "train", "Train a two-tower retriever and write its model artifact."),
    "evaluate": Command(
        "evaluate",
        "train",
        "Evaluate a trained model under one protocol, or compare the metrics of several runs.",
    ),
    "build-index": Command(
        "build_index",
        "train",
        "Build an index over a trained model's item embeddings and write its index artifact.",
    ),
    "train-ranker": Command(
        "train_ranker",
        "train",
        "Train a pre-ranking model on a retriever's candidates and measure the reranking.",
    ),
    "deploy": Command(
        "deploy", "serve", "Publish a model and its index as the new current version of a deployment root."
    ),
    "add-items": Command(
        "add_items",
        "serve",
        "Add, update or remove items of a deployment and publish the result as its new version.",
    ),
    "serve": Command("serve", "serve", "Serve a model and its index over gRPC until SIGTERM or SIGINT."),
    "query": Command("query", "client", "Ask a running retrieval server for the top-k items of a history."),
    "plot-attention": Command(
        "plot_attention",
        "train",
        "Draw a trained tower's attention maps over one user's history as a PNG heatmap.",
    ),
}
"""Command name -> its module, extra and summary, in the order of the path from a log to a server."""


def install_hint(extra: str) -> str:
    """The pip command installing ``extra``, quoted for a shell."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing_library(error: ModuleNotFoundError, what: str, extra: str) -> str | None:
    """The line telling that ``what`` (a command, an option) needs a library of ``extra``, e.g.
    ``this command needs the train extra (No module named 'yaml'): pip install
    'mitt-retrieval[train]'``; ``None`` when the missing module is one of this distribution's own
    (a broken install or a bug, which the traceback explains better)."""
    top = (error.name or "").partition(".")[0]
    if not top or top in OWN_PACKAGES:
        return None
    return f"{what} needs the {extra} extra ({error}): {install_hint(extra)}"


def version() -> str:
    """The installed distribution's version (``unknown`` when run from a checkout not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed)"


def parser(prog: str) -> argparse.ArgumentParser:
    """Parses the command's name only: everything after it is the command's own."""
    width = max(map(len, COMMANDS)) + 2
    listing = "\n".join(f"  {name:<{width}}{command.summary}" for name, command in COMMANDS.items())
    p = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [-h] [--version] COMMAND [ARGS ...]",
        description="Multi-interest two-tower retrieval: train, index, serve and query.",
        epilog=f"commands:\n{listing}\n\n'{prog} COMMAND --help' describes a command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=COMMANDS, metavar="COMMAND", help="one of the commands below")
    p.add_argument("--version", action="version", version=f"{DISTRIBUTION} {version()}")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "mitt") -> int:
    """Runs ``mitt COMMAND ARGS``: the exit status of the command's ``main``, 2 for a library
    its extra would install (or for a usage error, through argparse's exit)."""
    args = list(sys.argv[1:] if argv is None else argv)
    # Only the first argument is the dispatcher's: `mitt train --help` is train's help.
    name = parser(prog).parse_args(args[:1]).command
    command = COMMANDS[name]
    try:
        module = importlib.import_module(f"retrieval.cli.{command.module}")
        return int(module.main(args[1:], prog=f"{prog} {name}"))
    except ModuleNotFoundError as e:
        line = missing_library(e, "this command", command.extra)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
