"""The XLA-compiled ranker scorer (``load_ranker(..., xla=True)``, ``tools/serve.py --xla``)
answers as the plain graph: same logits to 1e-5 whatever the padding of rows, candidate lists
and unclicked lists, for every ranker, in the scorer and through the Retriever."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retrieval.api.types import Query, Rerank
from retrieval.artifacts.index import build_index_from_model
from retrieval.artifacts.ranker import load_ranker
from retrieval.artifacts.ranker_inputs import AttributeTable
from retrieval.artifacts.ranker_scorer import MAX_CELLS, XLA_ROWS, RankerScorer
from retrieval.artifacts.xla import COMPILED_BATCHES, COMPILED_WIDTHS, pad_to, padded_size
from retrieval.serving.retriever import Retriever
from tests.helpers import HISTORY, make_model, make_ranker, save_din, tiered
from tests.helpers import RANKER_ITEMS as NUM_ITEMS


def attribute_table(seed: int = 0) -> AttributeTable:
    """Two attributes per item of 6 (row 0, padding, has none)."""
    table = np.random.default_rng(seed).integers(1, 7, (NUM_ITEMS + 1, 2)).astype(np.int32)
    table[0] = 0
    return AttributeTable(tuple(f"a{i}" for i in range(1, 7)), table)


def lists(
    seed: int, rows: int, width: int
) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray], np.ndarray]:
    """Histories of 1..12 items, candidate lists in a retriever's shape (best first, each row's
    tail empty: -1), unclicked lists of 0..5 items and retrieval scores."""
    rng = np.random.default_rng(seed)
    histories = [rng.integers(1, NUM_ITEMS + 1, rng.integers(1, 13)) for _ in range(rows)]
    candidates = rng.integers(1, NUM_ITEMS + 1, (rows, width))
    for row in candidates:
        row[rng.integers(1, width + 1) :] = -1
    unclicked = [rng.integers(1, NUM_ITEMS + 1, rng.integers(0, 6)) for _ in range(rows)]
    scores = np.sort(rng.normal(size=(rows, width)).astype(np.float32), axis=1)[:, ::-1]
    return histories, candidates, unclicked, scores


@pytest.mark.parametrize("name", tiered(["din", "dien", "afm", "dstn"], slow={"dien", "afm"}))
def test_the_compiled_scorer_gives_the_plain_graphs_logits(name: str) -> None:
    ranker = make_ranker(name)
    unclicked = name == "dstn"
    plain = RankerScorer(ranker, attribute_table(), unclicked)
    fast = RankerScorer(ranker, attribute_table(), unclicked, xla=True)
    assert fast.compiled is not None
    # One list of 5 candidates padded to 16, one of 33 padded to 64.
    for seed, (rows, width) in enumerate([(1, 5), (1, 33)]):
        histories, candidates, shown, scores = lists(seed, rows, width)
        expected = plain.score(histories, candidates, shown, scores)
        got = fast.score(histories, candidates, shown, scores)
        np.testing.assert_array_equal(np.isinf(got), candidates <= 0)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not fast.compiled.refused  # XLA compiled it: the comparison was of the compiled path
    assert fast.tracing_count() == plain.tracing_count() == 1


def test_only_single_lists_run_compiled(monkeypatch) -> None:
    """A micro-batch of several lists, or a list wider than any compiled width, runs the plain
    graph (faster per list there); one list of the default depth runs compiled."""
    ranker = make_ranker("din")
    plain = RankerScorer(ranker, attribute_table(), False)
    fast = RankerScorer(ranker, attribute_table(), False, xla=True)
    assert fast.compiled is not None and XLA_ROWS == 1
    calls: list[tuple[int, ...]] = []
    compiled = fast.compiled.compiled
    monkeypatch.setattr(
        fast.compiled, "compiled", lambda x: calls.append(tuple(x["candidates"].shape)) or compiled(x)
    )
    # 40 rows of 200 go in chunks of MAX_CELLS cells; 1001 candidates are wider than any
    # compiled width.
    assert fast._rows_per_call(200) == MAX_CELLS // 200
    for seed, (rows, width) in enumerate([(40, 200), (2, 1001), (1, 1001), (1, 200)]):
        histories, candidates, _, scores = lists(10 + seed, rows, width)
        np.testing.assert_allclose(
            fast.score(histories, candidates, retrieval_scores=scores),
            plain.score(histories, candidates, retrieval_scores=scores),
            rtol=1e-5,
            atol=1e-5,
        )
    assert calls == [(1, 200)]  # the one single list of a compiled width


def test_padding_sizes() -> None:
    assert [padded_size(n, COMPILED_BATCHES) for n in (1, 2, 8, 9, 1024, 1025)] == [1, 8, 8, 32, 1024, None]
    assert padded_size(200, COMPILED_WIDTHS) == 200 and padded_size(201, COMPILED_WIDTHS) == 512
    padded = pad_to(np.ones((2, 3), np.int32), (8, 16))
    assert padded.shape == (8, 16) and padded.sum() == 6 and padded[:2, :3].all()


def test_a_retriever_with_compiled_rankers_reranks_as_the_plain_one(tmp_path: Path) -> None:
    model = make_model()
    path = save_din(tmp_path / "din", model.vocab, model.version, 0)
    index = build_index_from_model(model, "Flat")
    plain = Retriever(model, index, rankers=[load_ranker(path, model)])
    fast = Retriever(model, index, rankers=[load_ranker(path, model, xla=True)])
    assert fast.rankers["din"].scorer.compiled is not None
    queries = [
        Query(HISTORY, 5, rerank=Rerank(candidates=12)),
        Query(["item20", "item21"], 4, rerank=Rerank()),
    ]
    for query in queries:
        (a,) = fast.retrieve_many([query])
        (b,) = plain.retrieve_many([query])
        assert a.items == b.items
        np.testing.assert_allclose(a.rank_scores, b.rank_scores, rtol=1e-5, atol=1e-5)
    together = fast.retrieve_many(queries)
    assert [r.items for r in together] == [plain.retrieve_many([q])[0].items for q in queries]
