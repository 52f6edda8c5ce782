"""Ask a running retrieval server for the top-k items of a history.

mitt query --address 127.0.0.1:50051 --history 50 172 133 --k 10 --titles runs/ml100k-sa
mitt query --history 50 172 133 --merge diversity --lambda 0.5 --exclude 1 --json
mitt query --history 50 172 133 --rerank dstn --unclicked 98 181   # with impressions
mitt query --history 50 172 133 --explain --titles runs/ml100k-sa   # what made each interest
mitt query --info    # the served model and index, as JSON
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from google.protobuf.json_format import MessageToJson

from retrieval.api import (
    Explanations,
    MergeStrategy,
    Query,
    Rerank,
    RetrievalClient,
    RetrievalError,
    Retrieved,
    model_info_message,
)
from retrieval.cli.dispatch import missing_library
from retrieval.cli.inputs import flag_inputs, missing_inputs
from retrieval.cli.startup import command_parser, refuse
from retrieval.storage import ArtifactError

__all__ = ["main", "parse_args"]


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> argparse.Namespace:
    p = command_parser(prog, __doc__)
    p.add_argument("--address", default="127.0.0.1:50051", help="server host:port (default %(default)s)")
    p.add_argument("--history", nargs="+", metavar="ID", help="external item ids, oldest first")
    p.add_argument("--k", type=int, default=10, help="items wanted (default %(default)s)")
    p.add_argument(
        "--merge",
        choices=[m.value for m in MergeStrategy],
        default=MergeStrategy.MAX_SCORE.value,
        help="how the interests' lists are merged (default %(default)s)",
    )
    p.add_argument("--lambda", dest="diversity_lambda", type=float, default=0.0, help="diversity weight")
    p.add_argument("--per-interest-k", type=int, default=0, help="candidates per interest (0 = k)")
    p.add_argument("--exclude", nargs="+", default=[], metavar="ID", help="ids never to return")
    p.add_argument("--allow", nargs="+", default=[], metavar="ID", help="the only ids that may be returned")
    p.add_argument("--category", default="", help="only items with this attribute (genre, category)")
    p.add_argument(
        "--rerank",
        nargs="?",
        const="",
        metavar="RANKER",
        help="rerank the candidates with the server's ranker RANKER (none given: its only one)",
    )
    p.add_argument(
        "--rerank-candidates", type=int, default=0, help="candidates the ranker scores (0 = max(k, 200))"
    )
    p.add_argument(
        "--unclicked",
        nargs="+",
        default=[],
        metavar="ID",
        help="with --rerank: items shown and not clicked, for a ranker that reads them (DSTN); "
        "none given: the server computes them",
    )
    p.add_argument("--interests", action="store_true", help="also print the user's interest vectors")
    p.add_argument(
        "--explain",
        action="store_true",
        help="under each item, the history items that weigh most in the interest that found it",
    )
    p.add_argument("--user-id", default="", help="sent for the server's log only")
    p.add_argument("--info", action="store_true", help="print the served model and index instead")
    p.add_argument(
        "--titles", type=Path, metavar="MODEL_DIR", help="model folder whose vocabulary has titles"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=5.0, help="call deadline in seconds")
    p.add_argument("--tls-ca", type=Path, help="CA of the server's certificate (PEM): use TLS")
    p.add_argument("--tls-cert", type=Path, help="client certificate (PEM), for mutual TLS")
    p.add_argument("--tls-key", type=Path, help="client private key (PEM), for mutual TLS")
    args = p.parse_args(argv)
    if not args.info and not args.history:
        p.error("--history is required (unless --info)")
    if args.unclicked and args.rerank is None:
        p.error("--unclicked is read by the ranker: give --rerank too")
    return args


def query_of(args: argparse.Namespace) -> Query:
    """The query the flags ask for."""
    rerank = None if args.rerank is None else Rerank(args.rerank, args.rerank_candidates, args.unclicked)
    return Query(
        args.history,
        args.k,
        merge=args.merge,
        diversity_lambda=args.diversity_lambda,
        per_interest_k=args.per_interest_k,
        exclude=args.exclude,
        allow=args.allow,
        return_interests=args.interests,
        user_id=args.user_id,
        category=args.category,
        rerank=rerank,
        explain=args.explain,
    )


def load_titles(model_dir: Path) -> dict[str, str]:
    """External id -> title from a model folder's vocabulary (no TensorFlow needed)."""
    from retrieval.artifacts import read_model_vocab  # only with --titles: reads a model folder

    vocab = read_model_vocab(model_dir)
    return dict(zip(vocab.ids, vocab.titles or vocab.ids, strict=True))


def format_table(result: Retrieved, titles: dict[str, str] | None) -> str:
    """Rank, id, score, interest (, ranker logit) (and title) per line, under a header line."""
    reranked = result.rank_scores is not None
    lines = [f"model {result.model_version}, {result.unknown_items} unknown history ids"]
    if reranked:
        lines[0] += f", reranked by ranker {result.ranker_version}"
    lines.append(
        f"{'rank':>4}  {'item':<16} {'score':>9} {'interest':>8}"
        + (f" {'logit':>9}" if reranked else "")
        + ("  title" if titles else "")
    )
    logits = result.rank_scores or [0.0] * len(result.items)
    for rank, ((item, score, interest), logit) in enumerate(zip(result.items, logits, strict=True), 1):
        title = f"  {titles.get(item, '?')}" if titles else ""
        ranked = f" {logit:>9.4f}" if reranked else ""
        lines.append(f"{rank:>4}  {item:<16} {score:>9.4f} {interest:>8}{ranked}{title}")
        if result.explanations is not None:
            lines.append(f"{'':6}{explanation_line(result.explanations, interest, titles)}")
    return "\n".join(lines)


def explanation_line(explanations: Explanations, interest: int, titles: dict[str, str] | None) -> str:
    """``interest i: title (0.42), title (0.31), title (0.12)``: the history items that weigh most
    in the interest (ids without ``titles``), or why there are none.

    Example:
        >>> explanation_line(Explanations(ExplanationKind.ATTENTION, [[("50", 0.42, 2)]]), 0, None)
        'interest 0: 50 (0.42)'
    """
    if not explanations.interests:
        return f"interest {interest}: no explanation ({explanations.kind.value})"
    events = explanations.interests[interest]
    named = [f"{titles.get(item, item) if titles else item} ({weight:.2f})" for item, weight, _ in events]
    return f"interest {interest}: " + (", ".join(named) or "no weighed history item")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    if missing_inputs(flag_inputs(args, "titles", "tls_ca", "tls_cert", "tls_key")):
        return 2
    try:
        titles = load_titles(args.titles) if args.titles else None
    except ModuleNotFoundError as e:  # a client-only install: reading a model folder needs more
        line = missing_library(e, "--titles (reading a model folder)", "serve")
        if line is None:
            raise
        return refuse(line)
    except ArtifactError as e:
        return refuse(e)
    try:
        client = RetrievalClient(
            args.address, args.timeout, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key
        )
    except ValueError as e:
        return refuse(e)
    with client:
        try:
            if args.info:  # the message's JSON: field names as in the .proto's JSON mapping
                info = model_info_message(client.model_info())
                print(MessageToJson(info, always_print_fields_with_no_presence=True))
                return 0
            result = client.retrieve(query_of(args))
        except RetrievalError as e:
            print(f"error: {e.code().name}: {e.message}", file=sys.stderr)
            return 1
    interests = None if result.interests is None else result.interests.tolist()
    if args.json:
        unranked: list[float | None] = [None] * len(result.items)
        logits = [*result.rank_scores] if result.rank_scores else unranked
        items = [
            {"item_id": item, "score": score, "interest": interest}
            | ({"rank_score": logit} if logit is not None else {})
            | ({"title": titles.get(item, "?")} if titles else {})
            for (item, score, interest), logit in zip(result.items, logits, strict=True)
        ]
        print(
            json.dumps(
                {"model_version": result.model_version, "unknown_items": result.unknown_items, "items": items}
                | ({"ranker_version": result.ranker_version} if result.ranker_version else {})
                | ({"interests": interests} if interests is not None else {})
                | (
                    {"explanations": explanations_json(result.explanations)}
                    if result.explanations is not None
                    else {}
                )
            )
        )
    else:
        print(format_table(result, titles))
        for i, vector in enumerate(interests or []):
            print(f"interest {i}: " + " ".join(f"{v:.4f}" for v in vector))
    return 0


def explanations_json(explanations: Explanations) -> dict[str, object]:
    """``{"kind": ..., "interests": [[{"item_id", "weight", "position"}, ...], ...]}``."""
    interests = [
        [{"item_id": item, "weight": weight, "position": position} for item, weight, position in events]
        for events in explanations.interests
    ]
    return {"kind": explanations.kind.value, "interests": interests}
