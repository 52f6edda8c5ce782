"""What the commands do before their work, written once: the parser, the configuration's layers
(``--config FILE``, the flags, ``--set``), ``--print-config``, the inputs checked, TensorFlow
quieted, the log's format, the error line.

Nothing here imports more than the configuration mechanism: all of it runs before a command
imports TensorFlow, FAISS or pandas. A command with a configuration (``mitt train``,
``mitt train-ranker``, ``mitt build-index``) reads as the steps it takes::

    FLAG_FIELDS = {"epochs": "epochs", "lr": "learning_rate"}   # flag dest -> the field it sets

    def parse_args(argv, prog) -> tuple[RankerConfig, argparse.Namespace]:
        p = command_parser(prog, __doc__)
        p.add_argument("--model", type=Path, help="retrieval model folder")
        p.add_argument("--epochs", type=int, help="default 10")  # default None: given or not
        add_config_options(p, RankerConfig)                        # --config, --print-config, --set
        args = p.parse_args(argv)
        require(p, args, ["model"])                                # unless --print-config
        return layered(RankerConfig(), args, FLAG_FIELDS), args    # defaults, file, flags, --set

    def main(argv=None, prog=None) -> int:
        started = start(parse_args, argv, prog, lambda config, args: flag_inputs(args, "model"))
        if isinstance(started, int):  # an error line, the printed configuration, a missing input
            return started
        config, args = started
        from retrieval.ranking import train_ranker_from_dirs  # TensorFlow, quiet, from here on
        log_to_stderr()
        ...

A command without a configuration (``mitt evaluate``, ``mitt deploy``...) parses with
:func:`command_parser` and calls :func:`ready` before its heavy imports.

``mitt serve`` takes the same path with its ``ServerConfig`` (:mod:`retrieval.serving.config`):
each of its flags stands for a field in its ``FLAG_FIELDS``, ``--ranker`` (repeatable) gives
the whole ``rankers`` field through :func:`layered`'s ``given``, the fields that go together
are checked after every layer (:func:`retrieval.serving.check_server_config`), and its ``main``
names the files and folders the configuration holds, by flag or by key. What stays its own:
logging by :func:`retrieval.serving.configure_logging` instead of :func:`log_to_stderr`, and a
serving group's workers, which are handed the resolved configuration.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from retrieval.cli.inputs import Input, missing_inputs
from retrieval.config import (
    apply_flags,
    apply_overrides,
    config_to_json,
    flag_of,
    load_config_file,
    update_config,
)
from retrieval.environment import quiet_tensorflow

__all__ = [
    "add_config_options",
    "command_parser",
    "layered",
    "log_to_stderr",
    "ready",
    "refuse",
    "require",
    "start",
]

C = TypeVar("C")
"""A command's config dataclass."""

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
"""The commands' log lines on stderr: ``INFO build_index: tuning on 60 users' ...``."""


def command_parser(prog: str | None, doc: str | None) -> argparse.ArgumentParser:
    """A command's parser: ``prog`` (``mitt train``, or the script's name) and its module's
    docstring, examples and line breaks kept, as the description."""
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_config_options(
    p: argparse.ArgumentParser,
    cls: type,
    *,
    file_help: str = "settings from a JSON or YAML file (before the flags and --set)",
    set_metavar: str = "FIELD=VALUE",
    set_help: str | None = None,
) -> None:
    """``--config FILE``, ``--print-config`` and ``--set`` (repeatable) for the config ``cls``:
    what :func:`layered` and :func:`start` read."""
    p.add_argument("--config", type=Path, metavar="FILE", help=file_help)
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved configuration as JSON and exit"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar=set_metavar,
        help=set_help or f"any {cls.__name__} field",
    )


def require(
    p: argparse.ArgumentParser, args: argparse.Namespace, dests: Sequence[str], unmet: Sequence[str] = ()
) -> None:
    """Unless ``--print-config``, which needs no folder: argparse's error (usage, exit code 2)
    naming the flags of ``dests`` not given, then ``unmet`` (other requirements, as the caller
    words them: ``--ranker (or --config)``)."""
    if args.print_config:
        return
    missing = [flag_of(dest) for dest in dests if getattr(args, dest) is None] + list(unmet)
    if missing:
        p.error(f"the following arguments are required: {', '.join(missing)}")


def layered(
    config: C,
    args: argparse.Namespace,
    flag_fields: Mapping[str, str],
    given: Mapping[str, Any] | None = None,
) -> C:
    """``config`` (the defaults, or a preset) under the command line's layers, in order: the
    file of ``--config`` (JSON or YAML, whole or partial), ``given`` (a partial mapping from
    flags that set a whole field, such as ``--columns``), the flags that stand for fields
    (``flag_fields``: dest -> key; a flag not given changes nothing), then every ``--set``.

    Raises:
        ValueError: a file that cannot be read, an unknown key, or a value outside its choices or
            range, named by the file and key, the flag, or the ``--set`` key it came from.
    """
    if args.config is not None:
        file = load_config_file(args.config)  # its errors name the file
        try:
            config = update_config(config, file)
        except ValueError as e:  # a key or value of the file: named by the file, then the key
            raise ValueError(f"{args.config}: {e}") from None
    if given:
        config = update_config(config, given)
    return apply_overrides(apply_flags(config, vars(args), flag_fields), args.set)


def start(
    parse_args: Callable[[Sequence[str] | None, str | None], tuple[C, argparse.Namespace]],
    argv: Sequence[str] | None,
    prog: str | None,
    inputs: Callable[[C, argparse.Namespace], Mapping[str, Input]],
) -> tuple[C, argparse.Namespace] | int:
    """A configured command's start: its configuration and arguments, or the exit code it ends
    with before importing anything heavy.

    ``parse_args(argv, prog)`` resolves the configuration; a ``ValueError`` it raises is printed
    as one line (exit code 2). ``--print-config`` prints the configuration as JSON (exit code 0).
    Then :func:`ready`: the files and folders ``inputs(config, args)`` names (flag or key -> path)
    must exist, and TensorFlow is quieted unless ``--verbose``.
    """
    try:
        config, args = parse_args(argv, prog)
    except ValueError as e:  # a DataError (no data root, no dataset) is one too
        return refuse(e)
    if args.print_config:
        print(config_to_json(config))
        return 0
    if not ready(inputs(config, args), args.verbose):
        return 2
    return config, args


def ready(inputs: Mapping[str, Input], verbose: bool | None) -> bool:
    """Whether a command may go on to its heavy imports: every one of ``inputs`` (flag or key as
    given -> its path or paths) exists, else an error line names each that does not
    (:func:`~retrieval.cli.inputs.missing_inputs`). Then TensorFlow's start-up lines are hidden
    unless ``verbose`` (``None``: a command that never loads TensorFlow, left as it is).
    """
    if missing_inputs(inputs):
        return False
    if verbose is not None:
        quiet_tensorflow(verbose)
    return True


def log_to_stderr(level: int = logging.INFO) -> None:
    """The commands' log format on stderr, from ``level`` up. At INFO, call it after the heavy
    imports: configured before them, the log would show the libraries' own loading lines (FAISS
    logs at INFO every build of it that it tries)."""
    logging.basicConfig(level=level, format=LOG_FORMAT)


def refuse(error: object) -> int:
    """Prints ``error: <error>`` to stderr and returns the exit code of a refusal, 2."""
    print(f"error: {error}", file=sys.stderr)
    return 2
