r"""Publish a model and its index as the new current version of a deployment root.

    mitt deploy --model runs/ml100k-sa --index runs/ml100k-sa-index --root runs/live \
        [--ranker runs/ml100k-din]

Only the files each artifact's manifest lists are copied, and before the new version becomes
current it is loaded as a server would load it (warm-up, finite vectors, one retrieval): one
that fails is refused with exit code 2 and the root is left unchanged. A server started with
``mitt serve --watch runs/live`` loads the new version in the background, warms it up and swaps
it in without dropping a request. A deploy started while another writer of the root
(``mitt deploy``, ``mitt add-items``) publishes waits for it (a WARNING line says so). Prints the
new version folder.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from retrieval.cli.inputs import flag_inputs
from retrieval.cli.startup import command_parser, log_to_stderr, ready, refuse
from retrieval.environment import VERBOSE_HELP
from retrieval.storage import ArtifactError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    p = command_parser(prog, __doc__)
    p.add_argument("--model", required=True, type=Path, help="model artifact folder")
    p.add_argument("--index", required=True, type=Path, help="index artifact folder built from that model")
    p.add_argument("--root", required=True, type=Path, help="deployment root (created if missing)")
    p.add_argument(
        "--ranker",
        type=Path,
        action="append",
        default=[],
        help="a ranker artifact trained against that model (mitt train-ranker); repeatable",
    )
    p.add_argument("--keep", type=int, default=3, help="versions kept on disk (default %(default)s)")
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = p.parse_args(argv)
    if args.keep < 1:
        p.error("--keep must be >= 1")
    if not ready(flag_inputs(args, "model", "index", "ranker"), args.verbose):
        return 2
    log_to_stderr(logging.WARNING)
    # Imported here, never for --help: the artifacts layer loads FAISS and pandas, and the
    # check TensorFlow, once its logging is set.
    from retrieval.artifacts import publish_deployment
    from retrieval.serving import load_deployment

    # The check loads the version and warms it up for single queries only (plus its one
    # retrieval): a version that does that can serve; a server warms up the larger batches itself.
    check = partial(load_deployment, batch_sizes=(1,))
    try:
        folder = publish_deployment(
            args.model, args.index, args.root, args.keep, ranker_dirs=args.ranker, check=check
        )
    except ArtifactError as e:
        return refuse(f"not published, {args.root} unchanged: {' '.join(str(e).split())}")
    print(folder)
    return 0
