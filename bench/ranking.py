"""Does re-ranking the retriever's candidates help? Every ranker on one dataset: a results table.

    python -m bench.ranking                                   # Amazon Beauty, trains a SASRec retriever
    python -m bench.ranking --model runs/quality/beauty/loo/sasrec-none/seed42 --out runs/bench-ranking
    python -m bench.ranking --data ../shared/data/ml-100k --tower sa --tower-epochs 3 --epochs 2 \\
        --out runs/bench-ranking-ml100k                       # a small smoke run

The retriever (``--model``, or a ``--tower`` trained here with ``tools/train.py``'s defaults) and
its index (``--index``, or a Flat index built here) return their top ``--candidates`` for each
leave-one-out test user, history excluded. The click examples (``retrieval.ranking``: the last
clicks of every training sequence against the retriever's candidates the user did not choose)
are built once and every ranker is trained on them, then reranks the same test lists. Rows:
retrieval only (the retriever's own order) and each ranker (NDCG@10, HR@10, AUC and GAUC over the
candidates, the epoch whose weights were kept, training time, scoring time per user). A user whose
target was not retrieved counts 0 in every row.

Every ranker reads the retriever's scores by default: its own part is trained on the training
clicks and blended with the retrieval score on the validation users' retrieved lists (epoch 0, the
untrained ranker, is a candidate too, so a ranker that never helps keeps about the retriever's
order); ``--set retrieval_fit=clicks`` or ``joint`` fit the blend on the validation clicks or with
the ranker, ``--set options.retrieval_score=false`` trains the rankers alone
(``retrieval.ranking.config.RankerConfig``).

Runs whose artifact already exists under ``--out`` (the retriever, the index, each ranker) are
read back instead of redone, so an interrupted benchmark resumes. Writes ``results.json`` and
``table.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.data import add_data_root_argument, dataset_file
from rankers import ranker_names
from retrieval.artifacts import build_index_from_model, load_model, save_index
from retrieval.config import apply_overrides
from retrieval.data import build_sequences, load_interactions
from retrieval.ranking import (
    RankerConfig,
    build_ranking_data,
    evaluate_reranking,
    load_retrieval,
    train_ranker,
)
from retrieval.storage import MANIFEST
from retrieval.training import (
    Config,
    DataConfig,
    ModelConfig,
    TrainConfig,
    run_folder,
    train,
)
from towers import tower_names

log = logging.getLogger("bench.ranking")


def retriever_folders(args: argparse.Namespace) -> tuple[Path, Path]:
    """The retrieval model and index folders: given, read back from ``--out``, or made there."""
    model_dir = args.model or args.out / "retriever"
    if args.model is None and not (model_dir / MANIFEST).is_file():
        config = Config(
            DataConfig(path=str(args.data)),
            ModelConfig(tower=args.tower),
            TrainConfig(epochs=args.tower_epochs),
        )
        log.info("training the %s retriever (%d epochs) into %s", args.tower, args.tower_epochs, model_dir)
        train(config, model_dir, verbose=2, resume=run_folder(model_dir).is_dir())
    index_dir = args.index or args.out / "index"
    if args.index is None and not (index_dir / MANIFEST).is_file():
        model = load_model(model_dir)
        save_index(build_index_from_model(model, "Flat"), index_dir, model)
    return model_dir, index_dir


def markdown(rows: Sequence[dict[str, Any]], header: str) -> str:
    """The results table; rows as in ``results.json``."""

    def cell(value: Any, digits: int = 4) -> str:
        return f"{value:.{digits}f}" if isinstance(value, int | float) else "–"

    lines = [
        header,
        "",
        "| run | NDCG@10 | HR@10 | AUC | GAUC | best epoch | train s | score ms/user |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {cell(r['ndcg@10'])} | {cell(r['hr@10'])} | {cell(r['auc'])} | "
            f"{cell(r['gauc'])} | {cell(r.get('best_epoch'), 0)} | {cell(r.get('train_seconds'), 0)} | "
            f"{cell(r.get('score_ms_per_user'), 2)} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    base = RankerConfig()
    p.add_argument("--data", type=Path, help="interactions (default: beauty, Amazon Beauty, in --data-root)")
    add_data_root_argument(p)
    p.add_argument("--model", type=Path, help="retrieval model folder (default: train --tower into OUT)")
    p.add_argument("--index", type=Path, help="its index folder (default: a Flat index built into OUT)")
    p.add_argument(
        "--tower", choices=tower_names(), default="sasrec", help="retriever to train (default sasrec)"
    )
    p.add_argument("--tower-epochs", type=int, default=20, help="its epochs (default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("runs/bench-ranking"), help="default %(default)s")
    p.add_argument("--rankers", nargs="+", default=ranker_names(), choices=ranker_names())
    p.add_argument("--epochs", type=int, default=base.epochs, help="ranker epochs (default %(default)s)")
    p.add_argument(
        "--candidates", type=int, default=base.candidates, help="reranked list (default %(default)s)"
    )
    p.add_argument("--set", action="append", default=[], help="RankerConfig override for every ranker")
    args = p.parse_args(argv)
    args.data = args.data or dataset_file("beauty", args.data_root)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if not Path(args.data).exists():
        print(f"error: {args.data}: no such data (see --data-root)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    config = apply_overrides(
        RankerConfig(), [f"epochs={args.epochs}", f"candidates={args.candidates}", *args.set]
    )
    model_dir, index_dir = retriever_folders(args)
    retriever = load_retrieval(model_dir, index_dir)
    started = time.perf_counter()
    data = build_ranking_data(
        retriever.model, retriever.index, build_sequences(load_interactions(args.data)), config
    )
    log.info("ranking data built in %.0f s: %s", time.perf_counter() - started, data.settings)
    found = {k: v for k, v in evaluate_reranking(data.test, {}).items() if k != "rerankers"}
    tower = retriever.model.manifest.get("tower", "?")
    rows = rerank_rows(args, config, data, found, tower)
    command = " ".join(argv if argv is not None else sys.argv[1:])
    header = (
        f"Data: `{args.data}`, retriever `{model_dir}` ({tower}), {found['users']} test users, "
        f"{found['candidates']} candidates each (target retrieved for {found['candidate_recall']:.1%}), "
        f"{data.settings['train_examples']} training clicks, negatives {config.negatives} "
        f"({config.num_negatives} per click), ranker options {config.options or 'default'}, "
        f"retrieval_fit {config.retrieval_fit}, DSTN context {config.context_size}, "
        f"{datetime.now(UTC):%Y-%m-%d}; "
        f"command: `python -m bench.ranking {command}`"
    )
    table = markdown(rows, header)
    (args.out / "results.json").write_text(
        json.dumps({"config": config.to_dict(), "settings": data.settings, **found, "rows": rows}, indent=2)
    )
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    return 0


def rerank_rows(
    args: argparse.Namespace, config: RankerConfig, data: Any, found: dict[str, Any], tower: str
) -> list[dict[str, Any]]:
    """The retriever's own row, then each ranker's (trained into ``OUT/<ranker>``, or read back);
    ``results.json`` is rewritten after every ranker."""
    rows: list[dict[str, Any]] = [
        {"run": f"retrieval only ({tower}, top {found['candidates']})", **found["retrieval"]}
    ]
    for name in args.rankers:
        out = args.out / name
        if (out / MANIFEST).is_file():
            metrics = json.loads((out / "metrics.json").read_text())
        else:
            print(f"\n=== {name} ===", flush=True)
            trained = train_ranker(dataclasses.replace(config, ranker=name), data, out, verbose=2)
            metrics = trained.metrics.to_dict()
        reranked = metrics["reranked"]
        rows.append(
            {
                "run": f"+ {name}",
                **reranked,
                "train_seconds": metrics["train_seconds"],
                "best_epoch": metrics["best_epoch"],
                "score_ms_per_user": 1000 * reranked["score_seconds"] / max(metrics["users"], 1),
            }
        )
        payload = {"config": config.to_dict(), "settings": data.settings, **found, "rows": rows}
        (args.out / "results.json").write_text(json.dumps(payload, indent=2, default=str))
    return rows


if __name__ == "__main__":
    sys.exit(main())
