"""DSTN's unclicked items at serving time: computed by the server as ranker training builds them
(the previous request's retrieved items minus its click), or the request's own impressions
(``Rerank.unclicked``), through micro-batches, gRPC and the query tool."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval.api.client import RetrievalClient
from retrieval.api.convert import query_from_request, request_from_query
from retrieval.api.errors import InvalidArgument
from retrieval.api.types import MAX_FILTER_IDS, Query, Rerank
from retrieval.artifacts.index import build_index_from_model
from retrieval.artifacts.model import ModelArtifact
from retrieval.artifacts.ranker import DEFAULT_NUM_UNCLICKED, LoadedRanker, load_ranker
from retrieval.data.interactions import build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.ranking.config import RankerConfig
from retrieval.ranking.data import build_ranking_data
from retrieval.serving.retriever import Retriever
from tests.helpers import HISTORY, NUM_UNCLICKED, REPO_ROOT, config_of, save_din, save_dstn


class Spy:
    """Records the ``unclicked`` rows every call of a ranker's scorer receives."""

    def __init__(self, ranker: LoadedRanker, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[np.ndarray] | None] = []
        score = ranker.scorer.score

        def spy(histories: Any, candidates: Any, unclicked: Any = None, retrieval_scores: Any = None) -> Any:
            self.calls.append(None if unclicked is None else [np.asarray(u) for u in unclicked])
            return score(histories, candidates, unclicked, retrieval_scores)

        monkeypatch.setattr(ranker.scorer, "score", spy)


def brute_force_top(model: ModelArtifact, history: np.ndarray, n: int) -> np.ndarray:
    """Oracle: the top n items for ``history`` by the max over its interests of the inner product
    with every item embedding, padding and the history excluded (no side features, as ranker
    training encodes)."""
    interests = model.encode([history])[0]  # [K, d]
    active = interests[np.any(interests != 0, axis=1)]
    scores = (active @ model.item_embeddings.T).max(axis=0)  # [num_items + 1]
    scores[0] = -np.inf
    scores[history] = -np.inf
    ranked = np.argsort(-scores, kind="stable")
    return ranked[np.isfinite(scores[ranked])][:n]


def brute_force_unclicked(model: ModelArtifact, known: np.ndarray, n: int) -> np.ndarray:
    """Oracle: the previous request's (``known[:-1]``) top items without its click ``known[-1]``."""
    top = brute_force_top(model, known[:-1], n + 1)
    return top[top != known[-1]][:n]


# --------------------------------------------------------------------------- training parity


@pytest.fixture(scope="module")
def trained(
    model_versions: list[tuple[Path, Path, str]],
    synthetic_csv: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Retriever, LoadedRanker, Any]:
    """A retriever trained on the synthetic log, a DSTN artifact over it, and the ranking data
    ranker training builds from that log (candidates 30, num_unclicked 4)."""
    model_dir, index_dir, _ = model_versions[0]
    base = Retriever.from_dirs(model_dir, index_dir)
    config = RankerConfig(ranker="dstn", candidates=30, num_unclicked=NUM_UNCLICKED, context_size=5)
    sequences = build_sequences(load_interactions(synthetic_csv))
    data = build_ranking_data(base.model, base.index, sequences, config)
    out = tmp_path_factory.mktemp("trained") / "dstn"
    dstn = load_ranker(save_dstn(out, base.model.vocab, base.model.version, config.to_dict()), base.model)
    return Retriever(base.model, base.index, rankers=[dstn]), dstn, data


def test_the_server_computes_the_unclicked_items_as_ranker_training_does(
    trained: tuple[Retriever, LoadedRanker, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    retriever, dstn, data = trained
    assert dstn.num_unclicked == NUM_UNCLICKED  # read from the artifact's config.json
    lists = data.test  # each test history's previous request is the validation one
    spy = Spy(dstn, monkeypatch)
    histories = [retriever.model.vocab.external(h) for h in lists.histories]
    # All test users in one micro-batch: one tower call, the previous requests as extra rows.
    retriever.retrieve_many([Query(h, 10, rerank=Rerank("dstn", 30)) for h in histories])
    (served,) = spy.calls
    assert served is not None and len(served) == len(lists.histories)
    clicked_dropped = 0
    for known, computed, trained_on in zip(lists.histories, served, lists.unclicked, strict=True):
        # What build_ranking_data fed this user's test list, in the retriever's order.
        np.testing.assert_array_equal(computed, trained_on)
        # And an independent recomputation by brute force over the model's item embeddings.
        np.testing.assert_array_equal(computed, brute_force_unclicked(retriever.model, known, NUM_UNCLICKED))
        assert len(computed) == NUM_UNCLICKED
        clicked_dropped += int(known[-1] in brute_force_top(retriever.model, known[:-1], NUM_UNCLICKED))
    assert clicked_dropped > 0  # some previous requests had retrieved their click, which was left out


def test_a_history_of_one_known_event_has_no_unclicked_items(
    trained: tuple[Retriever, LoadedRanker, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    retriever, dstn, _ = trained
    spy = Spy(dstn, monkeypatch)
    item = retriever.model.vocab.ids[0]
    retriever.retrieve([item, "never-seen"], 5, rerank=Rerank(candidates=10))
    assert spy.calls[0] is not None and [len(u) for u in spy.calls[0]] == [0]


# --------------------------------------------------------------------------- explicit impressions


@pytest.fixture(scope="module")
def rankers(model: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> dict[str, LoadedRanker]:
    """DSTN reading 4 unclicked items, DSTN trained with ``unclicked="none"``, and DIN."""
    root = tmp_path_factory.mktemp("rankers")
    dstn = load_ranker(save_dstn(root / "dstn", model.vocab, model.version, config_of()), model)
    none = load_ranker(
        save_dstn(root / "none", model.vocab, model.version, config_of(unclicked="none")), model
    )
    din = load_ranker(save_din(root / "din", model.vocab, model.version, 0), model)
    return {"dstn": dstn, "none": none, "din": din}


@pytest.fixture(scope="module")
def retriever(model: ModelArtifact, rankers: dict[str, LoadedRanker]) -> Retriever:
    """Serves DSTN and DIN; the DSTN trained without unclicked items is served on its own."""
    return Retriever(model, build_index_from_model(model, "Flat"), rankers=[rankers["dstn"], rankers["din"]])


def scored_by_hand(
    retriever: Retriever, ranker: LoadedRanker, history: Sequence[str], shown: Sequence[str], n: int = 20
) -> np.ndarray:
    """Oracle: the ranker's logits of the plain top n, in the retrieval order, given ``shown``."""
    plain = retriever.retrieve(history, n).items
    vocab = retriever.model.vocab
    candidates = vocab.lookup([i for i, _, _ in plain])[None]
    scores = np.array([[s for _, s, _ in plain]], np.float32)
    known = vocab.lookup(list(history))
    return ranker.score([known[known > 0]], candidates, [vocab.lookup(list(shown))], scores)[0]


def test_explicit_unclicked_ids_replace_the_computed_ones(
    retriever: Retriever, rankers: dict[str, LoadedRanker]
) -> None:
    dstn = rankers["dstn"]
    shown = ["item20", "item21", "item22"]
    result = retriever.retrieve(HISTORY, 20, rerank=Rerank("dstn", 20, unclicked=[*shown, "no-such-item"]))
    expected = scored_by_hand(retriever, dstn, HISTORY, shown)  # the unknown id is ignored
    np.testing.assert_allclose(result.rank_scores, np.sort(expected)[::-1], rtol=1e-5)
    # The impressions matter: other logits than with none, or with the server's own.
    nothing = np.sort(scored_by_hand(retriever, dstn, HISTORY, []))[::-1]
    assert np.abs(np.array(result.rank_scores) - nothing).max() > 1e-3
    computed = retriever.retrieve(HISTORY, 20, rerank=Rerank("dstn", 20))
    assert np.abs(np.array(result.rank_scores) - computed.rank_scores).max() > 1e-3
    # The ranker reads as many as it was trained with: the first num_unclicked known ones.
    six = [f"item{i}" for i in range(20, 26)]
    first = retriever.retrieve(HISTORY, 20, rerank=Rerank("dstn", 20, unclicked=six))
    np.testing.assert_allclose(
        first.rank_scores, np.sort(scored_by_hand(retriever, dstn, HISTORY, six[:4]))[::-1], rtol=1e-5
    )
    # Only unknown ids: the caller's impressions are none the model knows, so none is read.
    unknown = retriever.retrieve(HISTORY, 20, rerank=Rerank("dstn", 20, unclicked=["no-such-item"]))
    np.testing.assert_allclose(unknown.rank_scores, nothing, rtol=1e-5)


def test_rankers_without_unclicked_items_ignore_them(
    model: ModelArtifact, retriever: Retriever, rankers: dict[str, LoadedRanker]
) -> None:
    shown = ["item20", "item21"]
    din = retriever.retrieve(HISTORY, 8, rerank=Rerank("din", 20, unclicked=shown))
    assert din == retriever.retrieve(HISTORY, 8, rerank=Rerank("din", 20))
    none = rankers["none"]
    assert none.num_unclicked == 0 and not none.scorer.uses_unclicked  # fed nothing, as trained
    alone = Retriever(model, retriever.index, rankers=[none])
    with_shown = alone.retrieve(HISTORY, 8, rerank=Rerank(candidates=20, unclicked=shown))
    assert with_shown == alone.retrieve(HISTORY, 8, rerank=Rerank(candidates=20))


def test_unclicked_defaults_and_limits(
    model: ModelArtifact, retriever: Retriever, rankers: dict[str, LoadedRanker], tmp_path: Path
) -> None:
    without_config = load_ranker(save_dstn(tmp_path / "bare", model.vocab, model.version, None), model)
    assert without_config.num_unclicked == DEFAULT_NUM_UNCLICKED  # ranker training's default
    assert rankers["din"].num_unclicked == 0
    with pytest.raises(InvalidArgument, match="unclicked has 10001 ids"):
        retriever.retrieve(HISTORY, 5, rerank=Rerank("dstn", unclicked=["x"] * (MAX_FILTER_IDS + 1)))


def test_a_micro_batch_mixing_dstn_and_plain_requests_answers_each_as_alone(
    retriever: Retriever, monkeypatch: pytest.MonkeyPatch
) -> None:
    queries = [
        Query(HISTORY, 5, rerank=Rerank("dstn", 15)),  # computed: one extra row
        Query(["item20"], 4),
        Query(["item01", "item02"], 3, rerank=Rerank("dstn", 12, unclicked=["item30", "item31"])),
        Query(["item05", "item06", "item07", "item08"], 6, rerank=Rerank("din", 20, unclicked=["item30"])),
        Query(["item10", "item11"], 4, rerank=Rerank("dstn", 10), category="", allow=["item12", "item13"]),
        Query(["item33"], 7, rerank=Rerank("dstn", 7)),  # one known event: no previous request
        Query(["item14", "item15", "item16"], 5, merge="round_robin", rerank=Rerank("dstn", 9)),
    ]
    rows: list[int] = []
    encode = ModelArtifact.encode

    def counted(self: ModelArtifact, histories: Any, features: Any = None) -> np.ndarray:
        rows.append(len(histories))
        return encode(self, histories, features)

    monkeypatch.setattr(ModelArtifact, "encode", counted)
    together = retriever.retrieve_many(queries)
    assert rows == [len(queries) + 3]  # one tower call: the queries and 3 previous requests
    for query, answer in zip(queries, together, strict=True):
        alone = retriever.retrieve_many([query])[0]
        assert answer.items == alone.items
        if alone.rank_scores is None:
            assert answer.rank_scores is None
        else:
            np.testing.assert_allclose(answer.rank_scores, alone.rank_scores, rtol=1e-5)


def test_a_plain_dstn_request_and_its_previous_request_share_one_search(retriever: Retriever) -> None:
    searches: list[float] = []
    retriever.observe_search = searches.append
    try:
        retriever.retrieve_many([Query(HISTORY, 5, rerank=Rerank("dstn", 15)), Query(["item20"], 4)])
    finally:
        retriever.observe_search = None
    assert len(searches) == 1


# --------------------------------------------------------------------------- gRPC and the query tool


def test_the_message_conversion_carries_unclicked_ids() -> None:
    query = Query(HISTORY, 5, rerank=Rerank("dstn", 30, unclicked=["item20", "item21"]))
    request = request_from_query(query)
    assert list(request.rerank.unclicked) == ["item20", "item21"]
    back = query_from_request(request).rerank
    assert back is not None and list(back.unclicked) == ["item20", "item21"]


def test_unclicked_ids_reach_dstn_over_grpc(address: str, retriever: Retriever) -> None:
    rerank = Rerank("dstn", 20, unclicked=["item20", "item21", "item22"])
    with RetrievalClient(address) as client:
        client.wait_until_serving(timeout=10)
        over_grpc = client.retrieve(HISTORY, 6, rerank=rerank)
        computed = client.retrieve(HISTORY, 6, rerank=Rerank("dstn", 20))
    direct = retriever.retrieve(HISTORY, 6, rerank=rerank)
    assert [i for i, _, _ in over_grpc.items] == [i for i, _, _ in direct.items]
    np.testing.assert_allclose(over_grpc.rank_scores, direct.rank_scores, rtol=1e-6)
    assert np.abs(np.array(over_grpc.rank_scores) - computed.rank_scores).max() > 1e-3


def test_the_query_tool_sends_unclicked_ids(address: str, retriever: Retriever) -> None:
    command = [sys.executable, str(REPO_ROOT / "tools" / "query.py"), "--address", address, "--json"]
    args = ["--history", *HISTORY, "--k", "4", "--rerank", "dstn", "--rerank-candidates", "12"]
    out = subprocess.run(
        [*command, *args, "--unclicked", "item20", "item21"], capture_output=True, text=True, check=True
    )
    expected = retriever.retrieve(HISTORY, 4, rerank=Rerank("dstn", 12, unclicked=["item20", "item21"]))
    items = json.loads(out.stdout)["items"]
    assert [i["item_id"] for i in items] == [i for i, _, _ in expected.items]
    np.testing.assert_allclose([i["rank_score"] for i in items], expected.rank_scores, rtol=1e-5)
    refused = subprocess.run([*command, "--history", "item01", "--unclicked", "item20"], capture_output=True)
    assert refused.returncode == 2 and b"give --rerank too" in refused.stderr
