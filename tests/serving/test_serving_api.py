"""The Retrieve options, BatchRetrieve and GetModelInfo on a real server, against numpy oracles."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from index.merge import diversity, round_robin
from retrieval.api.client import RetrievalClient
from retrieval.api.types import MAX_BATCH, MAX_FILTER_IDS, MAX_PER_INTEREST_K, MergeStrategy, ModelInfo, Query
from retrieval.api.v1 import retrieval_pb2
from retrieval.artifacts.index import build_index_from_model
from retrieval.artifacts.model import ModelArtifact
from retrieval.serving.retriever import Retriever
from tests.helpers import ITEMS, NUM_ITEMS, assert_same, brute_force
from tools import query as query_tool

# Items 0..29 carry a category (10 each of three), the last 10 none: each is its own category.
ATTRIBUTES = {item: [f"genre{i % 3}", "extra"] for i, item in enumerate(ITEMS[:30])}
HISTORIES = [["item03"], ["item01", "item07", "item22"], ITEMS[:12], ["item39", "item05"]]


def oracle_lists(
    model: ModelArtifact, history: list[str], fetch: int, exclude=(), allow=None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-interest top-``fetch`` (ids, scores) ``[K, fetch]`` by brute force over the items passing
    the filters: the history and ``exclude`` never, only ``allow`` when given."""
    known = [ITEMS.index(h) + 1 for h in history if h in ITEMS]
    interests = model.user_vectors({"items": np.array([known[-8:]], np.int32)})[0]  # [K, d]
    banned = set(known) | {ITEMS.index(e) + 1 for e in exclude if e in ITEMS}
    passing = [
        j for j in range(1, NUM_ITEMS + 1) if j not in banned and (allow is None or ITEMS[j - 1] in allow)
    ]
    ids = np.full((len(interests), fetch), -1)
    scores = np.full((len(interests), fetch), -np.inf, np.float32)
    for i, vector in enumerate(interests):
        ranked = sorted(passing, key=lambda j: -float(vector @ model.item_embeddings[j]))[:fetch]
        ids[i, : len(ranked)] = ranked
        scores[i, : len(ranked)] = [vector @ model.item_embeddings[j] for j in ranked]
    return ids, scores


def scored_under_every_interest(
    model: ModelArtifact, history: list[str], ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The candidates of all lists, each scored under every interest: ``[K, candidates]``
    (DIVERSITY ranks items by their best score over all interests)."""
    known = [ITEMS.index(h) + 1 for h in history if h in ITEMS]
    interests = model.user_vectors({"items": np.array([known[-8:]], np.int32)})[0]  # [K, d]
    found = np.unique(ids[ids >= 0])
    every = np.broadcast_to(found, (len(interests), len(found)))
    return every, (interests @ model.item_embeddings[found].T).astype(np.float32)


def categories_of(model: ModelArtifact) -> np.ndarray:
    """Independent category codes: genre number for the first 30 items, unique above."""
    codes = np.arange(NUM_ITEMS + 1) + 100
    for i in range(30):
        codes[i + 1] = i % 3
    return codes


class CountingIndex:
    """Delegates to an index and counts searches."""

    def __init__(self, index: Any) -> None:
        self._index, self.searches = index, 0

    def search(self, *args: Any, **kwargs: Any) -> Any:
        self.searches += 1
        return self._index.search(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)


@pytest.fixture(scope="module")
def retriever(model: ModelArtifact) -> Retriever:
    manifest = {"measured": {"k": 50, "recall": 0.987}}
    return Retriever(
        model, build_index_from_model(model, "Flat"), index_manifest=manifest, item_attributes=ATTRIBUTES
    )


@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize(("k", "per_interest_k"), [(5, 0), (4, 12)])
def test_round_robin_and_diversity_equal_the_oracle(
    client: RetrievalClient, model: ModelArtifact, history: list[str], k: int, per_interest_k: int
) -> None:
    ids, scores = oracle_lists(model, history, max(k, per_interest_k))
    got = client.retrieve(history, k, merge="round_robin", per_interest_k=per_interest_k)
    assert [item for item, _, _ in got.items] == [ITEMS[i - 1] for i in round_robin(ids, scores, k).ids]
    for lam in (0.0, 0.3, 5.0):
        got = client.retrieve(
            history, k, merge=MergeStrategy.DIVERSITY, diversity_lambda=lam, per_interest_k=per_interest_k
        )
        expected = diversity(*scored_under_every_interest(model, history, ids), k, categories_of(model), lam)
        assert [item for item, _, _ in got.items] == [ITEMS[i - 1] for i in expected.ids]
        np.testing.assert_allclose([s for _, s, _ in got.items], expected.scores, rtol=1e-5)


def test_retrieve_takes_a_query_or_its_fields(client: RetrievalClient, retriever: Retriever) -> None:
    """One definition of a request (Query): the client and the retriever take it whole or build it
    from a history, k and fields by name, and answer both the same."""
    fields: dict[str, Any] = {"merge": "diversity", "diversity_lambda": 0.3, "exclude": ["item02"]}
    query = Query(["item01", "item07"], 4, **fields)
    whole, by_fields = client.retrieve(query), client.retrieve(["item01", "item07"], 4, **fields)
    assert_same(whole.items, by_fields.items)
    assert_same(whole.items, retriever.retrieve(query).items)
    assert_same(whole.items, retriever.retrieve(history=["item01", "item07"], k=4, **fields).items)
    assert len(whole.items) == 4 and "item02" not in {item for item, _, _ in whole.items}
    assert len(client.retrieve(["item01"]).items) == 10  # k defaults to 10 on both sides
    assert len(retriever.retrieve(["item01"]).items) == 10
    for retrieve in (client.retrieve, retriever.retrieve):
        with pytest.raises(TypeError, match="a Query alone"):
            retrieve(query, 3)
        with pytest.raises(TypeError, match="bogus"):
            retrieve(["item01"], 3, bogus=True)


def test_diversity_with_lambda_zero_is_the_default_merge(client: RetrievalClient) -> None:
    history = ["item01", "item07", "item22"]
    assert_same(client.retrieve(history, 10, merge="diversity").items, client.retrieve(history, 10).items)


def test_large_lambda_spreads_over_categories(client: RetrievalClient) -> None:
    history = ["item01", "item07", "item22"]
    plain = client.retrieve(history, 6).items
    diverse = client.retrieve(history, 6, merge="diversity", diversity_lambda=100.0, per_interest_k=40).items

    def category(item: str) -> str:
        return ATTRIBUTES.get(item, [item])[0]

    # With a huge lambda every pick is a category not picked yet while one is left.
    assert len({category(i) for i, _, _ in diverse}) == 6
    assert len({category(i) for i, _, _ in diverse}) >= len({category(i) for i, _, _ in plain})


def test_exclude_and_allow_filter_like_the_oracle(client: RetrievalClient, model: ModelArtifact) -> None:
    history = ["item01", "item07"]
    allow = [*ITEMS[::3], "not-an-item"]  # unknown ids are ignored
    exclude = ["item03", "item09", "also-unknown"]
    got = client.retrieve(history, 8, exclude=exclude, allow=allow)
    ids, scores = oracle_lists(model, history, 8, exclude, set(allow))
    best: dict[int, float] = {}
    for item, score in zip(ids.ravel().tolist(), scores.ravel().tolist(), strict=True):
        if item >= 0:
            best[item] = max(score, best.get(item, -math.inf))
    expected = sorted(best, key=lambda j: (-best[j], j))[:8]
    assert [item for item, _, _ in got.items] == [ITEMS[j - 1] for j in expected]
    # Only unknown ids allowed: nothing may be returned.
    assert client.retrieve(history, 5, allow=["nope"]).items == []


def test_category_filter_like_the_oracle(client: RetrievalClient, model: ModelArtifact) -> None:
    history = ["item01", "item07"]
    genre1 = {item for item, values in ATTRIBUTES.items() if "genre1" in values}
    for allow, members in ((None, genre1), (ITEMS[:15], genre1 & set(ITEMS[:15]))):
        got = client.retrieve(history, 6, allow=allow or (), category="genre1")
        expected = [item for item, _, _ in brute_force(model, history, len(ITEMS)) if item in members][:6]
        assert [item for item, _, _ in got.items] == expected
    assert len(client.retrieve(history, 40, category="extra").items) == 28  # 30 items, 2 in the history
    with pytest.raises(grpc.RpcError) as error:
        client.retrieve(history, 5, category="no-such-genre")
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown category 'no-such-genre'" in (error.value.details() or "")


def test_return_interests_sends_the_user_vectors(client: RetrievalClient, model: ModelArtifact) -> None:
    got = client.retrieve(["item05", "item06"], 3, return_interests=True)
    expected = model.user_vectors({"items": np.array([[6, 7]], np.int32)})[0]
    assert got.interests is not None and got.interests.shape == expected.shape
    np.testing.assert_allclose(got.interests, expected, rtol=1e-6)
    assert client.retrieve(["item05"], 3).interests is None


def test_batch_equals_single_calls_with_one_tower_call_and_one_search(
    model: ModelArtifact, client: RetrievalClient
) -> None:
    calls = []

    def counting_tower(inputs: dict[str, np.ndarray]) -> np.ndarray:
        calls.append(len(inputs["items"]))
        return model.user_vectors(inputs)

    counted = dataclasses.replace(model, user_vectors=counting_tower)
    index = CountingIndex(build_index_from_model(model, "Flat"))
    retriever = Retriever(counted, index, item_attributes=ATTRIBUTES)  # type: ignore[arg-type]
    queries = [Query(h, k) for h, k in zip(HISTORIES, (3, 7, 5, 40), strict=True)]
    answers = retriever.retrieve_many(queries)
    assert calls == [len(queries)] and index.searches == 1
    for query, answer in zip(queries, answers, strict=True):
        assert_same(answer.items, brute_force(model, list(query.history), query.k))

    # Mixed options over gRPC: each answer equals the same request sent alone.
    mixed = [
        Query(HISTORIES[0], 5, merge="round_robin"),
        Query(HISTORIES[1], 4, merge="diversity", diversity_lambda=0.5, per_interest_k=10),
        Query(HISTORIES[2], 6, exclude=["item20"], allow=ITEMS[10:30], return_interests=True),
        Query(HISTORIES[3], 2, user_id="u-42"),
        Query(HISTORIES[0], 3, category="genre2"),
    ]
    for query, answer in zip(mixed, client.batch_retrieve(mixed), strict=True):
        alone = client.retrieve(
            query.history, query.k, merge=query.merge, diversity_lambda=query.diversity_lambda,
            per_interest_k=query.per_interest_k, exclude=query.exclude, allow=query.allow,
            return_interests=query.return_interests, category=query.category,
        )  # fmt: skip
        assert_same(answer.items, alone.items)
        assert (answer.interests is None) == (alone.interests is None)


def bad_request(**fields: Any) -> retrieval_pb2.RetrieveRequest:
    base: dict[str, Any] = {"history": ["item01"], "k": 5}
    return retrieval_pb2.RetrieveRequest(**(base | fields))


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (bad_request(merge="DIVERSITY", diversity_lambda=-0.5), "diversity_lambda must be a finite number"),
        (bad_request(merge="DIVERSITY", diversity_lambda=math.nan), "diversity_lambda must be a finite"),
        (bad_request(merge="DIVERSITY", diversity_lambda=math.inf), "diversity_lambda must be a finite"),
        (bad_request(diversity_lambda=0.5), "only used by the DIVERSITY merge, not MAX_SCORE"),
        (bad_request(per_interest_k=MAX_PER_INTEREST_K + 1), f"and {MAX_PER_INTEREST_K}, got"),
        (bad_request(per_interest_k=3), "between k (5)"),
        (bad_request(merge=7), "unknown merge strategy 7"),
        (bad_request(exclude_ids=["x"] * (MAX_FILTER_IDS + 1)), "exclude_ids has 10001 ids"),
        (bad_request(allow_ids=["x"] * (MAX_FILTER_IDS + 1)), "allow_ids has 10001 ids"),
        (bad_request(user_id="u" * 300), "user_id has 300 characters"),
    ],
)
def test_bad_options_are_invalid_argument(
    client: RetrievalClient, request_: retrieval_pb2.RetrieveRequest, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as error:
        client._stub.Retrieve(request_, timeout=5)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (error.value.details() or "")
    # The same request inside a batch names its position.
    batch = retrieval_pb2.BatchRetrieveRequest(requests=[bad_request(), request_])
    with pytest.raises(grpc.RpcError) as error:
        client._stub.BatchRetrieve(batch, timeout=5)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "requests[1]: " in (error.value.details() or "")


@pytest.mark.parametrize(("size", "message"), [(0, "the batch is empty"), (MAX_BATCH + 1, "at most 256")])
def test_batch_size_is_bounded(client: RetrievalClient, size: int, message: str) -> None:
    with pytest.raises(grpc.RpcError) as error:
        client.batch_retrieve([Query(["item01"], 2)] * size)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (error.value.details() or "")
    assert len(client.batch_retrieve([Query(["item01"], 2)] * MAX_BATCH)) == MAX_BATCH


def test_model_info_describes_model_and_index(client: RetrievalClient, retriever: Retriever) -> None:
    info = client.model_info()
    assert isinstance(info, ModelInfo)  # a dataclass, as retrieve() answers one
    assert (info.model_version, info.num_interests, info.dim, info.max_len, info.num_items) == (
        "model-v1",
        3,
        16,
        8,
        NUM_ITEMS,
    )
    assert (info.tower, info.side_features, info.rankers, info.reload_refusals, info.last_refusal) == (
        retriever.model.manifest.get("tower", ""),
        (),
        (),
        0,
        "",
    )
    index = dict(info.index)
    assert index.pop("recall") == pytest.approx(0.987) and index.pop("recall_k") == 50
    assert index == {
        "backend": "faiss",
        "factory": "Flat",
        "search_params": "",
        "is_exact": True,
        "count": NUM_ITEMS,
    }
    assert info.start_time == pytest.approx(retriever.start_time, abs=1e-6)
    # The same dataclass the server answered from: the message carries every field.
    served = retriever.model_info()
    assert dataclasses.replace(info, index=served.index, start_time=served.start_time) == served


def test_query_tool_passes_the_options(client: RetrievalClient, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--address", client.address, "--history", "item01", "item07", "--k", "4", "--json"]
    args += ["--merge", "diversity", "--lambda", "0.3", "--exclude", "item02", "--interests"]
    args += ["--category", "extra"]
    assert query_tool.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    expected = client.retrieve(
        ["item01", "item07"], 4, merge="diversity", diversity_lambda=0.3, exclude=["item02"], category="extra"
    )
    assert [i["item_id"] for i in out["items"]] == [item for item, _, _ in expected.items]
    assert len(out["interests"]) == 3 and len(out["interests"][0]) == 16
    assert query_tool.main(["--address", client.address, "--info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["modelVersion"] == "model-v1" and info["index"]["factory"] == "Flat"
    assert query_tool.main(["--address", client.address, "--history", "item01", "--lambda", "1"]) == 1
    assert "only used by the DIVERSITY merge" in capsys.readouterr().err


def test_masked_interests_contribute_nothing(model: ModelArtifact) -> None:
    def tower(inputs: dict[str, np.ndarray]) -> np.ndarray:
        vectors = model.user_vectors(inputs)
        vectors[:, 1] = 0  # interest 1 masked, as MIND does for users with few interests
        return vectors

    masked = dataclasses.replace(model, user_vectors=tower)
    retriever = Retriever(masked, build_index_from_model(model, "Flat"), item_attributes=ATTRIBUTES)
    history = ["item01", "item07", "item22"]
    ids, scores = oracle_lists(model, history, 10)
    ids[1], scores[1] = -1, -np.inf
    for merge, expected in (
        (MergeStrategy.ROUND_ROBIN, round_robin(ids, scores, 10)),
        (MergeStrategy.DIVERSITY, diversity(ids, scores, 10, categories_of(model), 0.4)),
    ):
        lam = 0.4 if merge is MergeStrategy.DIVERSITY else 0.0
        got = retriever.retrieve(history, 10, merge=merge, diversity_lambda=lam)
        assert [item for item, _, _ in got.items] == [ITEMS[i - 1] for i in expected.ids]
        assert 1 not in {interest for _, _, interest in got.items}
    plain = retriever.retrieve(history, 10).items
    assert 1 not in {interest for _, _, interest in plain}


def test_categories_come_from_the_model_folder(model: ModelArtifact, tmp_path: Path) -> None:
    attributes = {"item00": ["drama", "x"], "item01": ["drama"], "item02": ["comedy"], "item03": []}
    (tmp_path / "item_attributes.json").write_text(json.dumps(attributes | {"unknown": ["drama"]}))
    retriever = Retriever(dataclasses.replace(model, path=tmp_path), build_index_from_model(model, "Flat"))
    codes = retriever.categories.codes
    assert codes.shape == (NUM_ITEMS + 1,)
    assert codes[1] == codes[2] != codes[3]  # item00, item01 share "drama"; item02 is comedy
    # Items without attributes (item03, item04, ...) each have a category of their own.
    assert len(set(codes[[3, 4, 5, 6]].tolist())) == 4 and codes[4] not in (codes[1], codes[3])
