"""Parity of the native engine with the Python engine (issue 44): the same calls sent as raw bytes to
both, serving the same retriever, compared: status codes, what each error message says (equal,
but for an undecodable request's, whose end is protobuf's wording, which must name the same
thing; and a deadline's, worded by whichever side saw it pass first:
how soon each engine answers decides whether a deadline passes, so deadlines are tested on each
engine, tests/serving/test_native_server.py for this one), item ids and interests exactly, scores
(retrieval, rank, interest vectors, explanation weights) to float32 rounding.

The calls: every request shape of ``bench.robustness``'s Hypothesis generator (typed requests in
and out of the limits, hand-made wire bytes, undecodable bytes, batches of them) over the
fuzzer's synthetic model (side features, categories); reranks by DIN and DSTN (its unclicked
items computed from the previous request or sent); a trained ComiRec-SA with item attributes
(explanations from its attention), before and after items are added and removed (the new version
swapped into both engines through one ``RetrieverSlot``, a refused version counted). Needs
``make native``: every test skips without it."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.robustness import SYNTHETIC_ATTRIBUTES, SYNTHETIC_ITEMS, Call, FuzzClient, calls, make_call
from bench.robustness import synthetic_retriever as fuzzed_retriever
from retrieval.api.v1 import retrieval_pb2
from retrieval.artifacts.catalogue import change_catalogue
from retrieval.artifacts.changes import CatalogueItem
from retrieval.artifacts.deployment import publish_deployment
from retrieval.artifacts.ranker import load_ranker
from retrieval.serving import native
from retrieval.serving.config import LimitsConfig
from retrieval.serving.native_kernel import native_servable
from retrieval.serving.reload import RetrieverSlot, load_deployment
from retrieval.serving.retriever import Retriever
from tests.helpers import config_of, local, run_tool, save_din, save_dstn, serving

try:
    native.native_module()
except native.NativeEngineMissing as missing:
    pytest.skip(f"{missing}", allow_module_level=True)

LIMIT_MB = 1.0
"""Both engines' message limit (the fuzzer's: oversized requests are cheap to make)."""

EXAMPLES = 400
"""Generated calls per Hypothesis test."""

FLOAT32_ROUNDING = 8 * float(np.finfo(np.float32).eps)
"""Scores agree to a few float32 roundings of the largest in their list: the engines form other
batches, and a batch's size can change how a product is summed (FAISS's exact search switches
from its SIMD loop to BLAS at 20 queries; the tower's matrix products are blocked by batch)."""

Answer = tuple[grpc.StatusCode, str, bytes | None]

GENERATED = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same calls every run
    # Module fixtures are shared on purpose; calls to two servers are slow; some are large.
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
"""How the generated calls are drawn."""


@contextmanager
def engines(slot: RetrieverSlot) -> Iterator[tuple[FuzzClient, FuzzClient]]:
    """Clients of the Python engine and of the native engine, both serving ``slot`` (the native
    one following its swaps and refusals), with the same limits."""
    limits = LimitsConfig(max_request_mb=LIMIT_MB, max_response_mb=LIMIT_MB)
    server = native.NativeServer(native_servable(slot.current, slot.model_info()), limits=limits)
    server.follow(slot)
    server.start()
    try:
        with serving(slot, local(limits=limits, search_threads=1)) as address:
            python, engine = FuzzClient(address), FuzzClient(f"127.0.0.1:{server.port}")
            python.wait_ready()
            engine.wait_ready()
            yield python, engine
            python.close()
            engine.close()
    finally:
        server.stop(0)


def close(native_values: Any, python_values: Any, what: str) -> None:
    """Equal to float32 rounding (:data:`FLOAT32_ROUNDING` of the largest magnitude)."""
    got, expected = np.asarray(native_values, np.float64), np.asarray(python_values, np.float64)
    assert got.shape == expected.shape, what
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    np.testing.assert_allclose(got, expected, rtol=0, atol=FLOAT32_ROUNDING * max(scale, 1e-30), err_msg=what)


def assert_same_answer(got: retrieval_pb2.RetrieveResponse, expected: retrieval_pb2.RetrieveResponse) -> None:
    """Ids and interests exactly, scores to float32 rounding; everything else equal."""
    assert [(i.item_id, i.interest) for i in got.items] == [(i.item_id, i.interest) for i in expected.items]
    close([i.score for i in got.items], [i.score for i in expected.items], "scores")
    close([i.rank_score for i in got.items], [i.rank_score for i in expected.items], "rank scores")
    assert (got.model_version, got.unknown_items, got.ranker_version) == (
        expected.model_version,
        expected.unknown_items,
        expected.ranker_version,
    )
    close([list(v.values) for v in got.interests], [list(v.values) for v in expected.interests], "interests")
    assert got.HasField("explanations") == expected.HasField("explanations")
    assert got.explanations.kind == expected.explanations.kind
    events = [[(e.item_id, e.position) for e in i.events] for i in got.explanations.interests]
    assert events == [[(e.item_id, e.position) for e in i.events] for i in expected.explanations.interests]
    weights = [e.weight for i in got.explanations.interests for e in i.events]
    close(weights, [e.weight for i in expected.explanations.interests for e in i.events], "weights")


def assert_same(call: Call, got: Answer, expected: Answer) -> None:
    """The native engine's answer to ``call`` is the Python engine's (the module docstring)."""
    (code, details, body), (expected_code, expected_details, expected_body) = got, expected
    assert code == expected_code, f"{call.describe()}: {details!r} vs {expected_details!r}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:  # whichever side noticed first words it
        return
    if code is not grpc.StatusCode.OK:
        if expected_details.startswith("the request is not a valid "):  # protobuf's wording after it
            assert details.split(":")[0] == expected_details.split(":")[0]
        else:
            assert details == expected_details, call.describe()
        return
    assert body is not None and expected_body is not None
    if call.method == "GetModelInfo":
        assert retrieval_pb2.ModelInfo.FromString(body) == retrieval_pb2.ModelInfo.FromString(expected_body)
    elif call.method == "Retrieve":
        parse = retrieval_pb2.RetrieveResponse.FromString
        assert_same_answer(parse(body), parse(expected_body))
    else:
        answers = retrieval_pb2.BatchRetrieveResponse.FromString(body).responses
        expected_answers = retrieval_pb2.BatchRetrieveResponse.FromString(expected_body).responses
        assert len(answers) == len(expected_answers)
        for one, expected_one in zip(answers, expected_answers, strict=True):
            assert_same_answer(one, expected_one)


def compare(clients: tuple[FuzzClient, FuzzClient], call: Call, seen: Counter[str] | None = None) -> None:
    """Sends ``call`` to both engines and compares; counts the Python engine's code in ``seen``."""
    python, engine = clients
    expected = python.send(call)
    assert_same(call, engine.send(call), expected)
    if seen is not None:
        seen[f"{call.method} {expected[0].name}"] += 1


def retrieve(**fields: Any) -> Call:
    return make_call("Retrieve", retrieval_pb2.RetrieveRequest(**fields).SerializeToString(), "typed")


def batch(*requests: retrieval_pb2.RetrieveRequest) -> Call:
    payload = retrieval_pb2.BatchRetrieveRequest(requests=requests).SerializeToString()
    return make_call("BatchRetrieve", payload, "typed")


# --- the fuzzer's synthetic model, with rankers ---------------------------------------------------------


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FuzzClient, FuzzClient]]:
    """Both engines serving bench.robustness's synthetic model (side features ``action`` and
    ``gap_prev``, items in categories) with a DIN and a DSTN reading 4 unclicked items."""
    base = fuzzed_retriever()
    model, folder = base.model, tmp_path_factory.mktemp("rankers")
    rankers = [
        load_ranker(save_din(folder / "din", model.vocab, model.version, seed=3), model),
        load_ranker(save_dstn(folder / "dstn", model.vocab, model.version, config_of()), model),
    ]
    retriever = Retriever(model, base.index, item_attributes=SYNTHETIC_ATTRIBUTES, rankers=rankers)
    with engines(RetrieverSlot(retriever)) as clients:
        yield clients


CATEGORIES = sorted({value for values in SYNTHETIC_ATTRIBUTES.values() for value in values})
Statistics = Counter[str]


@pytest.fixture(scope="module")
def statistics() -> Iterator[Statistics]:
    """Codes of the generated calls compared, printed at the end (pytest -s shows them)."""
    seen: Statistics = Counter()
    yield seen
    print(f"\ngenerated calls compared: {sum(seen.values())}, {dict(sorted(seen.items()))}")


@pytest.mark.slow
@GENERATED
@given(call=calls(SYNTHETIC_ITEMS, CATEGORIES, undecodable=True, max_message_bytes=int(LIMIT_MB * 2**20)))
def test_every_generated_call_is_answered_as_the_python_engine_answers_it(
    fuzzed: tuple[FuzzClient, FuzzClient], statistics: Statistics, call: Call
) -> None:
    compare(fuzzed, call, statistics)


def test_the_generated_calls_reach_answers_and_every_kind_of_refusal(statistics: Statistics) -> None:
    """The generator's calls (run just before in this module) were answered and refused both."""
    if not statistics:
        pytest.skip("the generated calls did not run (they are marked slow)")
    codes = {name.split()[1] for name in statistics}
    assert {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"} <= codes
    assert {name.split()[0] for name in statistics} == {"Retrieve", "BatchRetrieve", "GetModelInfo"}


EVENTS = [
    retrieval_pb2.Event(item_id=item, timestamp=1_700_000_000 + 3600 * n**2, action=action)
    for n, (item, action) in enumerate(
        [("item03", "click"), ("item11", "1"), ("nope", "2"), ("item07", "buy"), ("item20", "")]
    )
]
OWN_REQUESTS = [
    retrieval_pb2.RetrieveRequest(history=["item03", "item11", "item07"], k=5),
    retrieval_pb2.RetrieveRequest(events=EVENTS, k=6, request_time=1_700_100_000, return_interests=True),
    retrieval_pb2.RetrieveRequest(events=EVENTS, k=4, merge=retrieval_pb2.ROUND_ROBIN, per_interest_k=9),
    retrieval_pb2.RetrieveRequest(
        history=["item01", "item02"],
        k=12,
        merge=retrieval_pb2.DIVERSITY,
        diversity_lambda=0.7,
        per_interest_k=20,
    ),
    retrieval_pb2.RetrieveRequest(history=["item05"], k=8, category="cat2", exclude_ids=["item12", "item17"]),
    retrieval_pb2.RetrieveRequest(history=["item05"], k=8, category="brand1", allow_ids=SYNTHETIC_ITEMS[:20]),
    retrieval_pb2.RetrieveRequest(history=["item05"], k=8, allow_ids=["item09", "item10", "gone"]),  # short
    retrieval_pb2.RetrieveRequest(history=["item05", "item06"], k=5, explain=True),
    retrieval_pb2.RetrieveRequest(history=["item05"], k=5, rerank=retrieval_pb2.Rerank()),  # two rankers
    retrieval_pb2.RetrieveRequest(
        history=["item05", "item30", "item31"], k=5, rerank=retrieval_pb2.Rerank(ranker="din", candidates=30)
    ),
    retrieval_pb2.RetrieveRequest(  # DSTN's unclicked items from the previous request (one more row)
        history=["item05", "item30", "item31"], k=5, rerank=retrieval_pb2.Rerank(ranker="dstn", candidates=30)
    ),
    retrieval_pb2.RetrieveRequest(  # and the caller's own
        history=["item05", "item30"],
        k=5,
        merge=retrieval_pb2.DIVERSITY,
        diversity_lambda=0.3,
        rerank=retrieval_pb2.Rerank(ranker="dstn", candidates=25, unclicked=["item40", "zz", "item41"]),
    ),
    retrieval_pb2.RetrieveRequest(
        history=["item05"], k=5, rerank=retrieval_pb2.Rerank(ranker="dstn")
    ),  # one event
    retrieval_pb2.RetrieveRequest(
        history=["item05"], k=30, rerank=retrieval_pb2.Rerank(ranker="din", candidates=10)
    ),
    retrieval_pb2.RetrieveRequest(history=["item05"], k=5, rerank=retrieval_pb2.Rerank(ranker="x" * 80)),
]


@pytest.mark.parametrize("request_", OWN_REQUESTS, ids=range(len(OWN_REQUESTS)))
def test_events_filters_merges_reranks_and_their_refusals(
    fuzzed: tuple[FuzzClient, FuzzClient], request_: retrieval_pb2.RetrieveRequest
) -> None:
    compare(fuzzed, make_call("Retrieve", request_.SerializeToString(), "typed"))


def test_a_batch_of_them_is_answered_as_each_alone_and_one_bad_member_refuses_it(
    fuzzed: tuple[FuzzClient, FuzzClient],
) -> None:
    good = [r for r in OWN_REQUESTS if not r.HasField("rerank") or r.rerank.ranker in ("din", "dstn")]
    compare(fuzzed, batch(*good))
    bad = [
        retrieval_pb2.RetrieveRequest(history=["item01"], k=0),
        retrieval_pb2.RetrieveRequest(history=["unknown", "ids"], k=3),
        retrieval_pb2.RetrieveRequest(history=["item01"], k=3, category="no such"),
        retrieval_pb2.RetrieveRequest(history=["item01"], events=EVENTS, k=3),
        retrieval_pb2.RetrieveRequest(history=["item01"] * 10_001, k=3),
    ]
    for one in bad:
        compare(fuzzed, batch(one))  # a batch of one bad request: its message without a prefix
        compare(fuzzed, batch(good[0], good[1], one, good[2]))  # requests[2]: ...
        compare(fuzzed, batch(good[0], one, *bad))  # the first bad one is named
    compare(fuzzed, batch())
    compare(fuzzed, batch(*[good[0]] * 257))


# --- a trained model, its catalogue changed while served ---------------------------------------------------

CLUSTERS, PER_CLUSTER = 4, 10


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deployment root of a ComiRec-SA (3 interests) trained one epoch on a log of users moving
    within one of 4 clusters of 10 items, with item attributes (a cluster's and a shared one) read
    by its item tower, so that items can be added (their attributes' vector) and removed."""
    folder = tmp_path_factory.mktemp("attributes")
    rng = np.random.default_rng(3)
    lines = []
    for user in range(80):
        cluster, start = user % CLUSTERS, int(rng.integers(PER_CLUSTER))
        items = [cluster * PER_CLUSTER + (start + s) % PER_CLUSTER for s in range(int(rng.integers(6, 12)))]
        lines.append(f"{user + 1} " + " ".join(str(i + 1) for i in items))
    (folder / "Toy.txt").write_text("\n".join(lines) + "\n")
    attributes = {str(i + 1): [i // PER_CLUSTER, 99] for i in range(CLUSTERS * PER_CLUSTER)}
    (folder / "Toy_item2attributes.json").write_text(json.dumps(attributes))
    code = run_tool(
        "train", "--data", str(folder / "Toy.txt"), "--model", "sa", "--num-interests", "3",
        "--out", str(folder / "model"), "--epochs", "1", "--dim", "8", "--max-len", "8", "--seed", "1",
        "--quiet", "--set", "model.side_features=attributes", "--set", "model.fusion=nova",
    )  # fmt: skip
    assert code == 0
    assert run_tool("build_index", "--model", str(folder / "model"), "--out", str(folder / "index")) == 0
    publish_deployment(folder / "model", folder / "index", folder / "live")
    return folder / "live"


def trained_calls(vocabulary: list[str]) -> list[Call]:
    """Requests over the trained catalogue: explanations, merges, filters, added and removed ids."""
    cluster_0 = [str(i) for i in range(1, 8)]
    return [
        retrieve(history=cluster_0, k=5, explain=True),
        retrieve(history=["3", "gone", "4"], k=5, explain=True, return_interests=True),
        retrieve(history=cluster_0, k=10, merge=retrieval_pb2.ROUND_ROBIN),
        retrieve(history=cluster_0, k=10, merge=retrieval_pb2.DIVERSITY, diversity_lambda=2.0),
        retrieve(history=cluster_0, k=5, category="2"),
        retrieve(history=cluster_0, k=5, allow_ids=["new-c0", "new-c2", "12", "2"]),
        retrieve(history=["new-c0"], k=5),  # added after training: not read as history
        retrieve(history=["new-c0", "9"], k=len(vocabulary), explain=True),
        retrieve(history=["1"], k=len(vocabulary)),  # the whole catalogue, removed items left out
        retrieve(history=["1"], k=5, exclude_ids=["new-c0", "5"], category="99"),
        batch(
            *[retrieval_pb2.RetrieveRequest(history=[item], k=4, explain=True) for item in vocabulary[:12]]
        ),
        make_call("GetModelInfo", b"", "typed"),
    ]


@pytest.mark.slow
def test_a_trained_model_and_its_catalogue_after_adds_and_removals(deployed: Path, tmp_path: Path) -> None:
    slot = RetrieverSlot(load_deployment(deployed))
    with engines(slot) as clients:
        before = list(slot.current.model.vocab.ids)
        code, _, body = clients[0].send(trained_calls(before)[0])  # the tower's attention explains
        explained = retrieval_pb2.RetrieveResponse.FromString(body or b"").explanations
        assert code is grpc.StatusCode.OK and explained.kind == retrieval_pb2.EXPLANATION_KIND_ATTENTION
        assert all(len(interest.events) == 3 for interest in explained.interests)
        for call in trained_calls(before):
            compare(clients, call)
        change_catalogue(
            deployed,
            [CatalogueItem("new-c0", ("0", "99"), "A cluster-0 newcomer"), CatalogueItem("new-c2", ("2",))],
            remove=["2", "3", "24"],
        )
        slot.swap(load_deployment(deployed, reuse=slot.current))  # what a DeploymentWatcher does
        grown = list(slot.current.model.vocab.ids)
        assert len(grown) == len(before) + 2
        for call in trained_calls(grown):
            compare(clients, call)
        slot.refuse(tmp_path / "broken-version", ValueError("a refused version"))
        compare(clients, make_call("GetModelInfo", b"", "typed"))


@pytest.fixture
def trained_engines(deployed: Path) -> Iterator[tuple[list[str], tuple[FuzzClient, FuzzClient]]]:
    """The trained deployment's ids and both engines serving it, started once for all the generated
    calls, as ``fuzzed`` is (loaded and started for each of the 100 examples: 47-68 s, now 9 s)."""
    retriever = load_deployment(deployed)
    with engines(RetrieverSlot(retriever)) as clients:
        yield list(retriever.model.vocab.ids), clients


@pytest.mark.slow
@settings(GENERATED, max_examples=EXAMPLES // 4)
@given(data=st.data())
def test_generated_calls_over_the_trained_model(
    trained_engines: tuple[list[str], tuple[FuzzClient, FuzzClient]], data: st.DataObject
) -> None:
    known, clients = trained_engines
    compare(
        clients, data.draw(calls(known, ["0", "1", "2", "3", "99"], max_message_bytes=int(LIMIT_MB * 2**20)))
    )
