"""The whole path through the real command-line tools: train -> index -> serve -> Retrieve.

Served results must equal brute-force top-k computed independently from the exported
artifact (item embeddings + user tower).
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from retrieval.api.client import RetrievalClient
from retrieval.api.v1 import retrieval_pb2
from retrieval.artifacts.model import encode_histories, load_model
from retrieval.data.interactions import build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.evaluation.evaluate import exact_top_k
from retrieval.serving.retriever import Retriever
from retrieval.serving.server import create_server
from tests.helpers import local, run_tool, tiered

TOWERS = ["sa", "sasrec", "youtubednn", "dr", "mind", "din", "bsarec"]
# Extra training options per tower: mind trains with its own interest selection (the
# TrainConfig fields reach the task), sa with its attention penalty (add_loss reaches fit),
# bsarec with its filter's options (ModelConfig fields reach the tower). The transformers take
# one block: the path is the same, and a block's graph is most of their training's CPU.
ONE_BLOCK = ["--set", "model.num_blocks=1"]
EXTRA_ARGS = {
    "mind": ["--set", "train.interest_selection=label_aware", "--set", "train.label_aware_power=2"],
    "sa": ["--set", "model.attention_penalty=0.01"],
    "sasrec": ONE_BLOCK,
    "bsarec": [*ONE_BLOCK, "--set", "model.filter_alpha=0.5", "--set", "model.filter_cutoff=2"],
}


# The fast tier trains sa and youtubednn end to end (2 s each); the others take 3 to 8 s.
@pytest.fixture(scope="module", params=tiered(TOWERS, slow={"sasrec", "dr", "mind", "din", "bsarec"}))
def trained(request, synthetic_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"e2e-{request.param}")
    model_dir, index_dir = out / "model", out / "index"
    code = run_tool(
        "train",
        "--data", str(synthetic_csv), "--model", request.param, "--out", str(model_dir),
        "--epochs", "3", "--dim", "16", "--max-len", "12", "--batch-size", "64", "--negatives", "20",
        "--quiet", *EXTRA_ARGS.get(request.param, []),
    )  # fmt: skip
    assert code == 0
    assert run_tool("build_index", "--model", str(model_dir), "--out", str(index_dir)) == 0
    return request.param, model_dir, index_dir


def test_artifact_is_complete_and_self_describing(trained) -> None:
    tower, model_dir, index_dir = trained
    manifest = json.loads((model_dir / "manifest.json").read_text())
    assert manifest["kind"] == "model" and manifest["tower"] == tower
    assert {"config.json", "vocab.json", "item_embeddings.npy", "metrics.json", "model.keras"} <= set(
        manifest["files"]
    )
    assert any(name.startswith("user_tower/") for name in manifest["files"])
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert set(metrics["test"]) >= {"hr@10", "ndcg@10", "recall@10", "hr@50", "ndcg@50"}
    assert json.loads((model_dir / "config.json").read_text())["model"]["tower"] == tower
    if tower == "bsarec":  # its options reached the saved tower
        import keras

        saved = keras.saving.load_model(model_dir / "model.keras").user_tower
        assert (saved.filter_alpha, saved.filter_cutoff) == (0.5, 2)
    index_manifest = json.loads((index_dir / "manifest.json").read_text())
    assert index_manifest["model_version"] == manifest["version"]
    # Training learned the synthetic structure: loss fell.
    losses = metrics["train_loss_per_epoch"]
    assert losses[-1] < losses[0]


def test_exported_tower_matches_the_keras_model(trained) -> None:
    import keras

    _, model_dir, _ = trained
    artifact = load_model(model_dir)
    keras_model = keras.saving.load_model(model_dir / "model.keras")
    histories = np.array([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]], np.int32)
    np.testing.assert_allclose(
        artifact.user_vectors({"items": histories}), np.asarray(keras_model({"items": histories})), atol=1e-5
    )


def test_served_results_equal_brute_force(trained, synthetic_csv) -> None:
    _, model_dir, index_dir = trained
    retriever = Retriever.from_dirs(model_dir, index_dir)
    server, port = create_server(retriever, local())  # started, health SERVING
    try:
        model = load_model(model_dir)
        data = build_sequences(load_interactions(synthetic_csv))
        with RetrievalClient(f"127.0.0.1:{port}") as client:
            assert client.health() == "SERVING"
            for seq in data.sequences[:10]:
                history = data.vocab.external(seq)
                got = client.retrieve(history, k=15)
                dense = model.vocab.lookup(history)
                expected = exact_top_k(encode_histories(model, [dense]), model.item_embeddings, [dense], 15)[
                    0
                ]
                assert [item for item, _, _ in got.items] == model.vocab.external(expected)
                assert not set(history) & {item for item, _, _ in got.items}
                assert got.model_version == model.version
            with pytest.raises(grpc.RpcError) as bad:
                client.retrieve([], k=5)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop(None)


def test_evaluate_through_flat_index_equals_exact(trained, synthetic_csv, capsys) -> None:
    _, model_dir, index_dir = trained
    assert run_tool("evaluate", "--model", str(model_dir), "--data", str(synthetic_csv)) == 0
    exact = json.loads(capsys.readouterr().out)
    assert (
        run_tool(
            "evaluate", "--model", str(model_dir), "--data", str(synthetic_csv), "--index", str(index_dir)
        )
        == 0
    )
    through_index = json.loads(capsys.readouterr().out)
    assert through_index["search"] == "Flat" and exact["search"] == "exact"
    for key in ("hr@10", "ndcg@10", "recall@50"):
        assert through_index[key] == pytest.approx(exact[key], abs=1e-9)
    # The same numbers training reported for its test split.
    trained_test = json.loads((model_dir / "metrics.json").read_text())["test"]
    assert exact["ndcg@10"] == pytest.approx(trained_test["ndcg@10"], abs=1e-6)


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_item_attributes_and_titles_travel_into_the_artifact(tmp_path) -> None:
    lines = [f"{u} " + " ".join(str(1 + (u + i) % 9) for i in range(6)) for u in range(1, 13)]
    (tmp_path / "Toy.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "Toy_item2attributes.json").write_text(json.dumps({str(i): [i % 3, 7] for i in range(1, 10)}))
    out = tmp_path / "model"
    args = ["--data", str(tmp_path / "Toy.txt"), "--out", str(out), "--epochs", "1", "--dim", "8"]
    assert run_tool("train", *args, "--negatives", "4", "--quiet") == 0
    attributes = json.loads((out / "item_attributes.json").read_text())
    assert attributes["4"] == ["1", "7"] and len(attributes) == 9
    assert "item_attributes.json" in json.loads((out / "manifest.json").read_text())["files"]
    # Refuses to overwrite without --overwrite, and says so.
    assert run_tool("train", *args, "--quiet") == 2


@pytest.fixture(scope="module")
def side_info_model(synthetic_csv, tmp_path_factory):
    """A SASRec with NOVA fusion of actions and time gaps, trained through the tools."""
    out = tmp_path_factory.mktemp("e2e-nova")
    rng = np.random.default_rng(3)
    lines = synthetic_csv.read_text().splitlines()
    rows = [lines[0] + ",action"] + [f"{line},{rng.choice(['view', 'buy'])}" for line in lines[1:]]
    data = out / "log.csv"
    data.write_text("\n".join(rows) + "\n")
    model_dir, index_dir = out / "model", out / "index"
    args = ["--data", str(data), "--model", "sasrec", "--out", str(model_dir), "--epochs", "2", "--dim", "16"]
    args += ["--max-len", "12", "--negatives", "20", "--quiet", *ONE_BLOCK]
    args += ["--set", "model.fusion=nova", "--set", "model.side_features=action,gap_prev"]
    assert run_tool("train", *args) == 0
    assert run_tool("build_index", "--model", str(model_dir), "--out", str(index_dir)) == 0
    return data, model_dir, index_dir


@pytest.mark.slow  # with the next test, trains the side-information model (module fixture): 7 s
def test_side_information_travels_from_request_events_to_the_tower(side_info_model) -> None:
    from retrieval.data.features import encode_events

    data_path, model_dir, index_dir = side_info_model
    model = load_model(model_dir)
    assert model.side.event_features == ("action", "gap_prev")
    assert json.loads((model_dir / "manifest.json").read_text())["inputs"] == ["items", "action", "gap_prev"]
    data = build_sequences(load_interactions(data_path))
    server, port = create_server(Retriever.from_dirs(model_dir, index_dir), local())
    try:
        with RetrievalClient(f"127.0.0.1:{port}") as client:
            for u in range(5):
                history = data.vocab.external(data.sequences[u])
                times = data.event_columns["timestamp"][u].tolist()
                actions = [str(a) for a in data.event_columns["action"][u]]
                got = client.retrieve(history, 10, timestamps=times, actions=actions)
                dense = model.vocab.lookup(history)
                features = {
                    name: [v] for name, v in encode_events(model.side, np.array(times), actions).items()
                }
                interests = model.encode([dense], features)
                expected = exact_top_k(interests, model.item_embeddings, [dense], 10)[0]
                assert [item for item, _, _ in got.items] == model.vocab.external(expected)
                # The side information matters: other actions give other interests.
                flipped = ["buy" if a == "view" else "view" for a in actions]
                other = {name: [v] for name, v in encode_events(model.side, np.array(times), flipped).items()}
                assert not np.allclose(model.encode([dense], other), interests)
            with pytest.raises(grpc.RpcError) as both:
                client._stub.Retrieve(
                    retrieval_pb2.RetrieveRequest(
                        history=["i1"], events=[retrieval_pb2.Event(item_id="i1")], k=3
                    )
                )
            assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop(None)


@pytest.mark.slow  # the side-information model's training, when run without the test above: 7 s
def test_evaluate_tool_reproduces_training_metrics_with_side_features(side_info_model, capsys) -> None:
    data_path, model_dir, _ = side_info_model
    assert run_tool("evaluate", "--model", str(model_dir), "--data", str(data_path)) == 0
    evaluated = json.loads(capsys.readouterr().out)
    trained_test = json.loads((model_dir / "metrics.json").read_text())["test"]
    assert evaluated["ndcg@50"] == pytest.approx(trained_test["ndcg@50"], abs=1e-6)


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_gap_to_request_time_is_the_same_in_training_evaluation_and_serving(
    synthetic_csv, tmp_path, capsys
) -> None:
    from retrieval.data.features import history_features, user_event_features

    model_dir, index_dir = tmp_path / "model", tmp_path / "index"
    args = ["--data", str(synthetic_csv), "--model", "sa", "--out", str(model_dir), "--epochs", "2"]
    args += ["--dim", "16", "--max-len", "12", "--negatives", "20", "--quiet"]
    args += ["--set", "model.fusion=nova", "--set", "model.side_features=gap_now,gap_prev"]
    assert run_tool("train", *args) == 0
    capsys.readouterr()
    # tools/evaluate.py measures the gaps as training did: the same test metrics.
    assert run_tool("evaluate", "--model", str(model_dir), "--data", str(synthetic_csv)) == 0
    trained_test = json.loads((model_dir / "metrics.json").read_text())["test"]
    assert json.loads(capsys.readouterr().out)["ndcg@50"] == pytest.approx(trained_test["ndcg@50"], abs=1e-6)

    assert run_tool("build_index", "--model", str(model_dir), "--out", str(index_dir)) == 0
    model = load_model(model_dir)
    data = build_sequences(load_interactions(synthetic_csv))
    per_user = user_event_features(data, model.side)
    server, port = create_server(Retriever.from_dirs(model_dir, index_dir), local())
    try:
        with RetrievalClient(f"127.0.0.1:{port}") as client:
            for u in range(4):
                n = len(data.sequences[u]) - 1  # the history before the user's last event
                history = data.vocab.external(data.sequences[u][:n])
                times = data.event_columns["timestamp"][u]
                request_time = int(times[n])
                got = client.retrieve(history, 10, timestamps=times[:n].tolist(), request_time=request_time)
                dense = model.vocab.lookup(history)
                features = history_features(per_user, [u], [n])  # gaps to the next event: times[n]
                expected = exact_top_k(model.encode([dense], features), model.item_embeddings, [dense], 10)[0]
                assert [item for item, _, _ in got.items] == model.vocab.external(expected)
                later = client.retrieve(
                    history, 10, timestamps=times[:n].tolist(), request_time=request_time + 10**8
                )
                assert [s for _, s, _ in later.items] != [s for _, s, _ in got.items]  # the gaps matter
    finally:
        server.stop(None)
