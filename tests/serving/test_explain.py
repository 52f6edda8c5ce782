"""Explanations (``RetrieveRequest.explain``) through a real server on port 0: each interest's top
history events carry the weights of the tower's attention maps
(:func:`retrieval.training.attention.attention_for_history`, what ``mitt plot-attention`` draws)
for the same history; towers without weights say so; a request without ``explain`` is answered
as before."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import keras
import numpy as np
import pytest

from retrieval.api.client import RetrievalClient
from retrieval.api.convert import (
    query_from_request,
    request_from_query,
    response_from_result,
    result_from_response,
)
from retrieval.api.types import EXPLAIN_TOP, ExplanationKind, Explanations, Query, Rerank, Retrieved
from retrieval.api.v1 import retrieval_pb2, retrieval_pb2_grpc
from retrieval.artifacts.index import build_index_from_model
from retrieval.artifacts.model import load_model
from retrieval.data.features import encode_events
from retrieval.data.vocab import PAD
from retrieval.serving.retriever import Retriever
from retrieval.storage.manifest import ArtifactError
from retrieval.training.attention import attention_for_history
from tests.helpers import connected, make_model, run_tool, save_din, serving, tiered

MAX_LEN = 8
# 11 events: one unknown id (position 2), "i3" twice, more known events (10) than max_len (8).
HISTORY = ["i3", "i5", "nope", "i12", "i7", "i3", "i8", "i9", "i14", "i1", "i2"]
OTHER = ["i21", "i22", "i25"]  # a shorter history, padded in a batch with HISTORY
TOWERS = {  # tower -> extra training flags; sasrec with two heads, which the weights average
    "sa": ["--num-interests", "3"],
    "dr": ["--num-interests", "3"],
    "sasrec": ["--set", "model.num_heads=2"],
}


@pytest.fixture(scope="module", params=tiered(TOWERS, slow={"sasrec", "dr"}))
def trained(request: pytest.FixtureRequest, synthetic_csv: Path, tmp_path_factory) -> tuple[str, Path, Path]:
    """``(tower, model dir, index dir)``: one epoch on the synthetic log, d = 8, max_len = 8."""
    tower = request.param
    out = tmp_path_factory.mktemp(f"explain-{tower}")
    code = run_tool(
        "train", "--data", str(synthetic_csv), "--model", tower, "--out", str(out / "model"),
        "--epochs", "1", "--dim", "8", "--max-len", str(MAX_LEN), "--negatives", "10", "--seed", "1",
        "--quiet", *TOWERS[tower],
    )  # fmt: skip
    assert code == 0
    assert run_tool("build_index", "--model", str(out / "model"), "--out", str(out / "index")) == 0
    return tower, out / "model", out / "index"


@pytest.fixture(scope="module")
def served(trained: tuple[str, Path, Path], tmp_path_factory) -> Iterator[tuple[RetrievalClient, str]]:
    """A client of a server of the trained model with an (untrained) DIN to rerank with, and the
    server's address."""
    _, model_dir, index_dir = trained
    retriever = Retriever.from_dirs(model_dir, index_dir)
    din = save_din(
        tmp_path_factory.mktemp("din") / "din", retriever.model.vocab, retriever.model_version, seed=3
    )
    retriever = Retriever.from_dirs(model_dir, index_dir, ranker_dirs=[din])
    with serving(retriever) as address, connected(address) as client:
        yield client, address


def oracle_weights(tower: str, model_dir: Path, history: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The Keras model's per-interest weights ``[K, n']`` over the events it reads, from
    :func:`attention_for_history` (the one map, or SASRec's last block averaged over its heads),
    and those events' positions in ``history`` ``[n']``."""
    model = keras.saving.load_model(model_dir / "model.keras")
    dense = load_model(model_dir, verify=False).vocab.lookup(history)
    maps = attention_for_history(model, dense[dense != PAD])
    weights = maps["block1"].mean(axis=0, keepdims=True) if tower == "sasrec" else next(iter(maps.values()))
    positions = np.flatnonzero(dense != PAD)[-weights.shape[1] :]
    return weights, positions


def assert_explains(explanations: Explanations, weights: np.ndarray, positions: np.ndarray) -> None:
    """Each interest lists its top events of ``weights`` (``[K, n]`` at ``positions`` of HISTORY)
    with their weights, largest first; near-ties may come in either order."""
    assert len(explanations.interests) == len(weights)
    for row, events in zip(weights, explanations.interests, strict=True):
        assert len(events) == EXPLAIN_TOP
        listed = [int(np.flatnonzero(positions == position)[0]) for _, _, position in events]
        assert [item for item, _, _ in events] == [HISTORY[p] for _, _, p in events]  # ids of the history
        np.testing.assert_allclose([w for _, w, _ in events], row[listed], atol=1e-5)
        assert [w for _, w, _ in events] == sorted((w for _, w, _ in events), reverse=True)
        others = np.delete(row, listed)
        assert others.max() <= min(w for _, w, _ in events) + 1e-5  # no heavier event left out


def test_weights_are_the_towers_attention_maps(trained, served) -> None:
    tower, model_dir, _ = trained
    client, _ = served
    result = client.retrieve(HISTORY, k=10, explain=True)
    assert result.explanations is not None
    expected_kind = ExplanationKind.ROUTING if tower == "dr" else ExplanationKind.ATTENTION
    assert result.explanations.kind is expected_kind
    weights, positions = oracle_weights(tower, model_dir, HISTORY)
    assert list(positions) == [3, 4, 5, 6, 7, 8, 9, 10]  # the last max_len known events, none other
    assert_explains(result.explanations, weights, positions)
    # Every item's interest indexes the explanations.
    assert all(interest < len(result.explanations.interests) for _, _, interest in result.items)


@pytest.mark.slow  # trains one more model: 5 s
def test_a_nova_tower_weighs_the_side_features_sent(synthetic_csv: Path, tmp_path: Path) -> None:
    # ComiRec-SA with NOVA fusion of the gap to the previous event: the attention depends on the
    # timestamps sent with the events, and the explanations are those of the same inputs.
    code = run_tool(
        "train", "--data", str(synthetic_csv), "--model", "sa", "--out", str(tmp_path / "model"),
        "--epochs", "1", "--dim", "8", "--max-len", str(MAX_LEN), "--negatives", "10", "--quiet",
        "--set", "model.fusion=nova", "--set", "model.side_features=gap_prev",
    )  # fmt: skip
    assert code == 0
    model = load_model(tmp_path / "model")
    timestamps = [1_000_000 + 60 * i**3 for i in range(len(HISTORY))]  # gaps from 1 min to 11 days
    with (
        serving(Retriever(model, build_index_from_model(model, "Flat"))) as address,
        connected(address) as client,
    ):
        result = client.retrieve(HISTORY, k=5, timestamps=timestamps, explain=True)
    assert result.explanations is not None and result.explanations.kind is ExplanationKind.ATTENTION
    dense = model.vocab.lookup(HISTORY)
    known = dense != PAD
    gaps = encode_events(model.side, np.array(timestamps), None)["gap_prev"][known]  # over the whole timeline
    inputs = {"items": dense[known][None, -MAX_LEN:].astype(np.int32), "gap_prev": gaps[None, -MAX_LEN:]}
    keras_model = keras.saving.load_model(tmp_path / "model" / "model.keras")
    weights = np.asarray(keras_model.user_tower.attention_maps(inputs)["interests"])[0]
    assert_explains(result.explanations, weights, np.flatnonzero(known)[-MAX_LEN:])
    blind = keras_model.user_tower.attention_maps({**inputs, "gap_prev": np.zeros_like(inputs["gap_prev"])})
    assert not np.allclose(np.asarray(blind["interests"])[0], weights, atol=1e-4)  # the gaps count


def test_without_explain_the_answer_is_as_before(served) -> None:
    client, address = served
    plain, explained = client.retrieve(HISTORY, k=10), client.retrieve(HISTORY, k=10, explain=True)
    assert plain.explanations is None
    assert explained.items == plain.items
    # On the wire: the field is absent, and it is the only difference.
    import grpc

    with grpc.insecure_channel(address) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        without = stub.Retrieve(retrieval_pb2.RetrieveRequest(history=HISTORY, k=10))
        with_field = stub.Retrieve(retrieval_pb2.RetrieveRequest(history=HISTORY, k=10, explain=True))
    assert not without.HasField("explanations") and with_field.HasField("explanations")
    with_field.ClearField("explanations")
    assert with_field == without


def test_batch_explains_the_requests_that_ask(served) -> None:
    client, _ = served
    alone = [client.retrieve(h, k=5, explain=True).explanations for h in (HISTORY, OTHER)]
    answers = client.batch_retrieve(
        [Query(HISTORY, 5, explain=True), Query(HISTORY, 5), Query(OTHER, 5, explain=True)]
    )
    assert answers[1].explanations is None
    for got, expected in zip([answers[0].explanations, answers[2].explanations], alone, strict=True):
        assert got is not None and expected is not None
        assert [[(i, p) for i, _, p in e] for e in got.interests] == [
            [(i, p) for i, _, p in e] for e in expected.interests
        ]
        for events, same in zip(got.interests, expected.interests, strict=True):
            np.testing.assert_allclose([w for _, w, _ in events], [w for _, w, _ in same], atol=1e-5)
    # The short history's events are all it has (3 known, padded in the batch).
    assert answers[2].explanations is not None
    assert {p for e in answers[2].explanations.interests for _, _, p in e} <= {0, 1, 2}


def test_reranked_items_keep_the_interest_that_retrieved_them(served) -> None:
    client, _ = served
    candidates = client.retrieve(HISTORY, k=30)
    found_by = {item: interest for item, _, interest in candidates.items}
    reranked = client.retrieve(HISTORY, k=5, rerank=Rerank(candidates=30), explain=True)
    assert reranked.ranker_version and reranked.rank_scores is not None
    assert all(found_by[item] == interest for item, _, interest in reranked.items)
    assert reranked.explanations == client.retrieve(HISTORY, k=5, explain=True).explanations


def test_query_explain_prints_each_items_interest(served, capsys) -> None:
    _, address = served
    code = run_tool("query", "--address", address, "--history", *HISTORY, "--k", "3", "--explain")
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    items, explained = lines[2::2], lines[3::2]  # after the header lines, each item then its line
    assert len(items) == len(explained) == 3
    for item_line, line in zip(items, explained, strict=True):
        interest = int(item_line.split()[3])
        match = re.fullmatch(rf"\s+interest {interest}: (.*)", line)
        assert match is not None, line
        # No titles in this vocabulary: ids, each with its weight, largest first.
        named = re.findall(r"(\S+) \((\d\.\d\d)\)", match.group(1))
        assert len(named) == EXPLAIN_TOP and {item for item, _ in named} <= set(HISTORY)
        assert [w for _, w in named] == sorted((w for _, w in named), reverse=True)
    code = run_tool("query", "--address", address, "--history", *HISTORY, "--k", "3", "--explain", "--json")
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert len(printed["explanations"]["interests"][0]) == EXPLAIN_TOP


def test_youtubednn_has_no_weights(model_versions) -> None:
    model_dir, index_dir, _ = model_versions[0]
    with serving(Retriever.from_dirs(model_dir, index_dir)) as address, connected(address) as client:
        result = client.retrieve(HISTORY, k=5, explain=True)
    assert result.explanations == Explanations(ExplanationKind.NONE)
    assert len(result.items) == 5


def test_an_artifact_without_the_endpoint_says_unavailable(model_versions, trained, tmp_path) -> None:
    # A model in memory, and one exported before explanations (no manifest field, no endpoint).
    model = make_model()
    answer = Retriever(model, build_index_from_model(model, "Flat")).retrieve(["item03"], 3, explain=True)
    assert answer.explanations == Explanations(ExplanationKind.UNAVAILABLE)
    older = shutil.copytree(model_versions[0][0], tmp_path / "older")
    manifest = json.loads((older / "manifest.json").read_text())
    assert manifest.pop("explanation") == "none"
    (older / "manifest.json").write_text(json.dumps(manifest))
    assert load_model(older).explanation == "unavailable"
    # A manifest that the endpoints contradict is refused.
    _, model_dir, _ = trained
    contradicted = shutil.copytree(model_dir, tmp_path / "contradicted")
    manifest = json.loads((contradicted / "manifest.json").read_text())
    (contradicted / "manifest.json").write_text(json.dumps(manifest | {"explanation": "none"}))
    with pytest.raises(ArtifactError, match="has an interest_weights endpoint"):
        load_model(contradicted)


def test_the_proto_conversion_round_trips() -> None:
    back = query_from_request(request_from_query(Query(HISTORY, 5, explain=True)))
    assert back.explain and back == Query(HISTORY, 5, exclude=[], allow=[], explain=True)
    assert not request_from_query(Query(HISTORY, 5)).explain
    explained = Explanations(ExplanationKind.ROUTING, [[("i3", 0.5, 5), ("i2", 0.25, 10)], []])
    for explanations in (explained, Explanations(ExplanationKind.NONE), None):
        result = Retrieved([("i9", 1.5, 1)], 1, "v1", explanations=explanations)
        response = response_from_result(result)
        assert response.HasField("explanations") == (explanations is not None)
        assert (
            result_from_response(retrieval_pb2.RetrieveResponse.FromString(response.SerializeToString()))
            == result
        )
    # A kind this client does not know (a newer server's) reads as unavailable.
    response = retrieval_pb2.RetrieveResponse(explanations=retrieval_pb2.Explanations(kind=99))  # type: ignore[arg-type]
    assert result_from_response(response).explanations == Explanations(ExplanationKind.UNAVAILABLE)
