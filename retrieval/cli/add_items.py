r"""Add, update or remove items of a deployment and publish the result as its new version.

    mitt add-items --root runs/live --items new.jsonl [--remove gone.txt] [--compact]
    mitt add-items --root runs/live --compact     # the current version, written whole

``--items`` is JSON lines, one item per line: ``{"id": "B0999", "attributes": ["Lipstick",
"Brand 7"], "title": "Rose lipstick"}`` (title optional). An item the model never saw gets the
vector of its attributes (cold start: the model must have been trained with
``--set model.side_features=attributes``, better also ``model.id_dropout``); an id already in
the catalogue is updated. ``--remove`` lists ids, one per line, never to be retrieved again (any
model can remove items; an id removed already is reported as such, not counted as removed).

The change is published as a new version of the root, atomically, as ``mitt deploy`` does: a
server started with ``mitt serve --watch runs/live`` swaps it in without dropping a request,
and a restart serves it. The version holds the current one's files (hard links) and the changes
since they were written, which a watching server applies to what it already holds; once the
changes outgrow a tenth of the catalogue (or with ``--compact``) the version is written whole.
A change that cannot be made leaves the root unchanged, with exit code 2, and so does one that
would change nothing (an empty file, ids all removed already): exit code 0 means the change is
published. Writers of a root (``mitt deploy``, ``mitt add-items``) take turns: one started while
another publishes waits for it (a WARNING line says so), then changes what it published. Prints
the version.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from retrieval.cli.inputs import flag_inputs
from retrieval.cli.startup import command_parser, log_to_stderr, ready, refuse
from retrieval.storage import ArtifactError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    p = command_parser(prog, __doc__)
    p.add_argument("--root", required=True, type=Path, help="deployment root (mitt deploy --root)")
    p.add_argument("--items", type=Path, help="JSON-lines file of items to add or update")
    p.add_argument("--remove", type=Path, help="file of item ids to remove, one per line")
    p.add_argument("--compact", action="store_true", help="write the version whole, changes merged in")
    p.add_argument("--keep", type=int, default=3, help="versions kept on disk (default %(default)s)")
    args = p.parse_args(argv)
    if args.items is None and args.remove is None and not args.compact:
        p.error("give --items, --remove, --compact or several")
    if args.keep < 1:
        p.error("--keep must be >= 1")
    if not ready(flag_inputs(args, "root", "items", "remove"), verbose=None):  # loads no TensorFlow
        return 2
    log_to_stderr(logging.WARNING)
    # Imported here, never for --help: the artifacts layer loads FAISS and NumPy.
    from retrieval.artifacts.catalogue import change_catalogue, read_ids, read_items

    try:
        items = read_items(args.items) if args.items else []
        remove = read_ids(args.remove) if args.remove else []
        for given, read in ((args.items, items), (args.remove, remove)):
            if given and not read:  # an export that failed upstream, most likely
                raise ValueError(f"nothing to publish: {given} is empty")
        change = change_catalogue(args.root, items, remove, keep=args.keep, compact=args.compact or None)
    except (ArtifactError, ValueError, OSError) as e:
        return refuse(f"not published, {args.root} unchanged: {' '.join(str(e).split())}")
    already = f" ({change.already_removed} removed already)" if change.already_removed else ""
    whole = ", written whole" if change.compacted else ""
    print(
        f"{change.folder}: model {change.model_version}, {change.added} added, {change.updated} updated, "
        f"{change.removed} removed{already}, {change.items} items{whole}"
    )
    return 0
