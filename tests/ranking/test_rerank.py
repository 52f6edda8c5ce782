"""Pre-ranking inside Retrieve: the retrieved candidates scored by a ranker, its best k returned;
in the Retriever, through micro-batches, over gRPC and in a deployment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrieval.api.client import RetrievalClient
from retrieval.api.errors import InvalidArgument
from retrieval.api.types import Query, Rerank
from retrieval.artifacts.deployment import deployment_rankers, publish_deployment
from retrieval.artifacts.index import build_index_from_model
from retrieval.artifacts.model import ModelArtifact
from retrieval.artifacts.ranker import LoadedRanker, load_ranker
from retrieval.data.vocab import ItemVocab
from retrieval.serving.reload import load_deployment
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import create_server
from retrieval.storage.manifest import ArtifactError
from tests.helpers import HISTORY, NUM_ITEMS, REPO_ROOT, local, make_model, save_din


@pytest.fixture(scope="module")
def ranker(model: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> LoadedRanker:
    return load_ranker(
        save_din(tmp_path_factory.mktemp("ranker") / "din", model.vocab, model.version, 0), model
    )


@pytest.fixture(scope="module")
def retriever(model: ModelArtifact, ranker: LoadedRanker) -> Retriever:
    return Retriever(model, build_index_from_model(model, "Flat"), rankers=[ranker])


def reranked_by_hand(retriever: Retriever, ranker: LoadedRanker, history: list[str], k: int, n: int) -> list:
    """Oracle: retrieve n without rerank, score them with the ranker, sort by logit (stable)."""
    plain = retriever.retrieve(history, n).items
    known = retriever.model.vocab.lookup(history)
    candidates = retriever.model.vocab.lookup([i for i, _, _ in plain])[None]
    scores = np.array([[s for _, s, _ in plain]], np.float32)
    logits = ranker.score([known[known > 0]], candidates, retrieval_scores=scores)[0]
    order = sorted(range(len(plain)), key=lambda j: -logits[j])[:k]
    return [(plain[j], float(logits[j])) for j in order]


def test_a_rerank_returns_the_best_k_of_the_candidates_by_the_rankers_score(
    retriever: Retriever, ranker: LoadedRanker
) -> None:
    result = retriever.retrieve(HISTORY, 5, rerank=Rerank(candidates=20))
    expected = reranked_by_hand(retriever, ranker, HISTORY, 5, 20)
    assert [i for i, _, _ in result.items] == [item[0] for item, _ in expected]
    np.testing.assert_allclose(result.rank_scores, [s for _, s in expected], rtol=1e-5)
    # Each item keeps its retrieval score and interest; the order is the ranker's, not retrieval's.
    assert result.items == [item for item, _ in expected]
    assert result.rank_scores == sorted(result.rank_scores, reverse=True)
    assert result.ranker_version == ranker.version
    plain = retriever.retrieve(HISTORY, 5)
    assert plain.rank_scores is None and plain.ranker_version == ""
    assert [i for i, _, _ in result.items] != [i for i, _, _ in plain.items]  # the ranker mattered


def test_default_candidates_are_all_there_are_up_to_200(retriever: Retriever, ranker: LoadedRanker) -> None:
    # 40 items, 3 in the history: the default depth (200) reaches every other item.
    result = retriever.retrieve(HISTORY, 6, rerank=Rerank())
    expected = reranked_by_hand(retriever, ranker, HISTORY, 6, NUM_ITEMS)
    assert [i for i, _, _ in result.items] == [item[0] for item, _ in expected]


def test_a_micro_batch_mixing_reranked_and_plain_queries_answers_each_as_alone(retriever: Retriever) -> None:
    queries = [
        Query(HISTORY, 5, rerank=Rerank(candidates=12)),
        Query(["item20"], 4),
        Query(["item01", "item02"], 3, rerank=Rerank("din", 30), merge="round_robin"),
        Query(["item33"], 7, rerank=Rerank(candidates=7)),
    ]
    together = retriever.retrieve_many(queries)
    for query, answer in zip(queries, together, strict=True):
        alone = retriever.retrieve_many([query])[0]
        assert answer.items == alone.items
        assert (
            answer.rank_scores == pytest.approx(alone.rank_scores)
            if alone.rank_scores
            else not answer.rank_scores
        )


@pytest.mark.parametrize(
    ("rerank", "k", "message"),
    [
        (Rerank("dien"), 5, "unknown ranker 'dien'"),
        (Rerank(candidates=4), 5, "between k"),
        (Rerank(candidates=5000), 5, "between k"),
    ],
)
def test_bad_reranks_are_invalid_arguments(
    retriever: Retriever, rerank: Rerank, k: int, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        retriever.retrieve(HISTORY, k, rerank=rerank)


def test_a_rerank_needs_a_ranker_and_a_name_when_there_are_several(
    model: ModelArtifact, ranker: LoadedRanker, tmp_path: Path
) -> None:
    index = build_index_from_model(model, "Flat")
    with pytest.raises(InvalidArgument, match="no ranker"):
        Retriever(model, index).retrieve(HISTORY, 5, rerank=Rerank())
    with pytest.raises(ArtifactError, match="two rankers are named 'din'"):
        Retriever(model, index, rankers=[ranker, ranker])
    other = make_model("model-v2")
    other_vocab = ItemVocab.from_ids([f"other{i}" for i in range(NUM_ITEMS)])
    foreign = load_ranker(save_din(tmp_path / "foreign", other_vocab, other.version, 1), None)
    with pytest.raises(ArtifactError, match="another item vocabulary"):
        Retriever(model, index, rankers=[foreign])


def test_rerank_over_grpc_equals_the_retriever(client: RetrievalClient, retriever: Retriever) -> None:
    for rerank in (Rerank(), Rerank("din", 15)):
        over_grpc = client.retrieve(HISTORY, 5, rerank=rerank)
        direct = retriever.retrieve(HISTORY, 5, rerank=rerank)
        assert [i for i, _, _ in over_grpc.items] == [i for i, _, _ in direct.items]
        np.testing.assert_allclose(over_grpc.rank_scores, direct.rank_scores, rtol=1e-6)
        assert over_grpc.ranker_version == direct.ranker_version != ""
    plain = client.retrieve(HISTORY, 5)
    assert plain.rank_scores is None and plain.ranker_version == ""
    assert list(client.model_info().rankers) == ["din"]


def test_a_served_rerank_reads_the_retrieval_scores(model: ModelArtifact, tmp_path: Path) -> None:
    # g = 0, w = -1: the ranker's logit is minus the retrieval score, so a served rerank must
    # return the retrieved candidates in reverse. Without the scores (all 0) every logit would
    # tie and the stable sort would keep the retrieval order.
    path = save_din(tmp_path / "reverse", model.vocab, model.version, 0, -1.0, ranker_scale_init=0.0)
    reverse = load_ranker(path, model)
    retriever = Retriever(model, build_index_from_model(model, "Flat"), rankers=[reverse])
    server, port = create_server(retriever, local())
    try:
        with RetrievalClient(f"127.0.0.1:{port}") as client:
            client.wait_until_serving(timeout=10)
            reranked = client.retrieve(HISTORY, 4, rerank=Rerank(candidates=12))
            plain = client.retrieve(HISTORY, 12)
    finally:
        server.stop(None)
    assert [i for i, _, _ in reranked.items] == [i for i, _, _ in plain.items][::-1][:4]
    scores = [s for _, s, _ in plain.items][::-1][:4]
    np.testing.assert_allclose(reranked.rank_scores, [-s for s in scores], rtol=1e-5)
    assert [s for _, s, _ in reranked.items] == pytest.approx(scores)  # each keeps its retrieval score


def test_the_query_tool_asks_for_a_rerank(address: str, client: RetrievalClient) -> None:
    command = [sys.executable, str(REPO_ROOT / "tools" / "query.py"), "--address", address, "--json"]
    args = ["--history", *HISTORY, "--k", "4", "--rerank", "--rerank-candidates", "12"]
    out = json.loads(subprocess.run([*command, *args], capture_output=True, text=True, check=True).stdout)
    expected = client.retrieve(HISTORY, 4, rerank=Rerank(candidates=12))
    assert [i["item_id"] for i in out["items"]] == [i for i, _, _ in expected.items]
    np.testing.assert_allclose([i["rank_score"] for i in out["items"]], expected.rank_scores, rtol=1e-6)
    assert out["ranker_version"] == expected.ranker_version
    table = subprocess.run([*command[:-1], *args, "--rerank", "dstn"], capture_output=True, text=True)
    assert table.returncode == 1 and "INVALID_ARGUMENT: unknown ranker 'dstn'" in table.stderr


def test_a_deployment_carries_its_rankers(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    model_dir, index_dir, version = model_versions[0]
    vocab = ItemVocab.load(model_dir / "vocab.json")
    din = save_din(tmp_path / "din", vocab, version, 0)
    foreign = save_din(tmp_path / "foreign", ItemVocab.from_ids(["a", "b"]), "other", 0)
    root = tmp_path / "live"
    with pytest.raises(ArtifactError, match="another item vocabulary"):
        publish_deployment(model_dir, index_dir, root, ranker_dirs=[din, foreign])
    assert not (root / "current").exists()  # nothing published
    folder = publish_deployment(model_dir, index_dir, root, ranker_dirs=[din])
    assert [p.name for p in deployment_rankers(root)] == ["din"] and folder.is_dir()
    retriever = load_deployment(root)
    history = vocab.ids[:3]
    result = retriever.retrieve(history, 4, rerank=Rerank(candidates=10))
    assert result.ranker_version == load_ranker(din).version and len(result.items) == 4
    assert deployment_rankers(model_versions[1][0].parent / "nowhere") == []


@pytest.mark.parametrize(
    "module", ["retrieval.api.client", "retrieval.artifacts.deployment", "tools.deploy", "tools.query"]
)
def test_clients_and_deploys_start_without_tensorflow(module: str) -> None:
    # Rankers need TensorFlow; a client, the query tool and a deploy must not pay for it (a
    # deploy that took seconds to start delayed every hot reload).
    code = f"import sys; import {module}; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    )
    assert out.stdout.split() == ["False", "False"]
