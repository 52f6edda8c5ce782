"""The files and folders a command reads, checked before it imports anything heavy.

A command's libraries (TensorFlow, FAISS, pandas) take seconds to import: an input that is not
there is reported first, naming the flag it was given with, so a typo costs no wait.

Example:
    >>> args = argparse.Namespace(model="runs/nope", data=None)
    >>> missing_inputs(flag_inputs(args, "model", "data"))  # doctest: +SKIP
    error: --model runs/nope: no such file or directory
    True
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from retrieval.config import flag_of

__all__ = ["Input", "flag_inputs", "missing_inputs"]

Input = str | Path | Sequence[str | Path] | None
"""What a flag gave: a path, several (a repeatable flag), or nothing (not given)."""


def flag_inputs(args: argparse.Namespace, *dests: str) -> dict[str, Input]:
    """The paths the flags stored as ``dests`` gave, by flag: ``{"--model": args.model, ...}``."""
    return {flag_of(dest): getattr(args, dest) for dest in dests}


def missing_inputs(inputs: Mapping[str, Input]) -> bool:
    """Whether any of ``inputs`` (the flag or key as the user typed it -> its path or paths) does
    not exist; prints ``error: --model runs/nope: no such file or directory`` for each that does not.

    A URI (``s3://bucket/prepared``) and the stand-in for data a model was trained on in memory
    (``<DataFrame 676 rows, ...>``, a saved config's ``data.path``) are left to the library that
    reads them: only it can tell, or explain.
    """
    missing = []
    for flag, given in inputs.items():
        paths = [] if given is None else [given] if isinstance(given, str | Path) else list(given)
        missing += [f"{flag} {path}" for path in paths if _local(str(path)) and not Path(path).exists()]
    for what in missing:
        print(f"error: {what}: no such file or directory", file=sys.stderr)
    return bool(missing)


def _local(path: str) -> bool:
    """Whether ``path`` names a local file or folder: not a URI, nor a stand-in such as
    ``<DataFrame ...>`` (:func:`retrieval.data.frame_source`)."""
    return "://" not in path and not (path.startswith("<") and path.endswith(">"))
