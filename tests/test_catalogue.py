"""A living catalogue: cold-start vectors from attributes, ``mitt add-items`` publishing a
version that a watching server swaps in, removed items never coming back."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest

from retrieval.artifacts.catalogue import CatalogueItem, change_catalogue, cold_vectors, read_items
from retrieval.artifacts.deployment import deployment_dirs, publish_deployment
from retrieval.artifacts.index import build_index_from_model
from retrieval.artifacts.model import load_model
from retrieval.artifacts.ranker import LoadedRanker, check_same_vocab
from retrieval.data.vocab import ItemVocab
from retrieval.serving.reload import load_deployment, open_deployment
from retrieval.storage.manifest import ArtifactError
from retrieval.storage.versions import resolve_current
from tests.helpers import ReloadUnderLoad, connected, run_tool
from towers.item import ItemTower

CLUSTERS, PER_CLUSTER = 4, 10


@pytest.fixture(scope="module")
def attributes_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SASRec-format log (``Toy.txt``) of 80 users moving within one of 4 clusters of 10 items
    (ids ``1..40``, cluster ``(id - 1) // 10``), with ``Toy_item2attributes.json``: each item
    has its cluster's attribute (``"0"``..``"3"``) and a shared one (``"99"``)."""
    rng = np.random.default_rng(3)
    folder = tmp_path_factory.mktemp("toy")
    lines = []
    for user in range(80):
        cluster = user % CLUSTERS
        start = int(rng.integers(PER_CLUSTER))
        items = [cluster * PER_CLUSTER + (start + s) % PER_CLUSTER for s in range(int(rng.integers(6, 12)))]
        lines.append(f"{user + 1} " + " ".join(str(i + 1) for i in items))
    (folder / "Toy.txt").write_text("\n".join(lines) + "\n")
    attributes = {str(i + 1): [i // PER_CLUSTER, 99] for i in range(CLUSTERS * PER_CLUSTER)}
    (folder / "Toy_item2attributes.json").write_text(json.dumps(attributes))
    return folder / "Toy.txt"


def _train(data: Path, out: Path, *options: str) -> Path:
    code = run_tool(
        "train", "--data", str(data), "--model", "sasrec", "--out", str(out), "--epochs", "8",
        "--dim", "16", "--max-len", "12", "--seed", "1", "--quiet", *options,
    )  # fmt: skip
    assert code == 0
    return out


@pytest.fixture(scope="module")
def deployed(attributes_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model trained with attributes and id-dropout, its Flat index, as a deployment root."""
    out = tmp_path_factory.mktemp("catalogue")
    model_dir = _train(
        attributes_data, out / "model", "--set", "model.side_features=attributes",
        "--set", "model.fusion=nova", "--set", "model.id_dropout=0.5",
    )  # fmt: skip
    assert run_tool("build_index", "--model", str(model_dir), "--out", str(out / "index")) == 0
    publish_deployment(model_dir, out / "index", out / "live")
    return out / "live"


def _copy_root(root: Path, tmp_path: Path) -> Path:
    """A fresh deployment root holding ``root``'s current version (tests change their own)."""
    model_dir, index_dir = deployment_dirs(root)
    publish_deployment(model_dir, index_dir, tmp_path / "live")
    return tmp_path / "live"


def _write_items(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


# --- the item tower ---------------------------------------------------------------------------


def _dropout_tower(seed: int) -> ItemTower:
    keras.utils.set_random_seed(seed)
    tower = ItemTower(201, 8, num_attributes=3, max_attributes=2, id_dropout=0.5)
    tower.build()
    table = np.zeros((201, 2), np.int32)
    table[1:, 0] = 1 + np.arange(200) % 3
    tower.set_item_attributes(table)
    return tower


def _dropped_rows(tower: ItemTower, ids: np.ndarray) -> np.ndarray:
    attribute_part = np.asarray(tower.attributes(ids))
    full = np.asarray(tower(ids))
    trained = np.asarray(tower.candidates(ids, training=True))
    dropped = np.all(np.isclose(trained, attribute_part, atol=1e-7), axis=1)
    kept = np.all(np.isclose(trained, full, atol=1e-7), axis=1)
    assert np.all(dropped | kept)
    return dropped


def test_id_dropout_leaves_the_attribute_part_alone_for_training_candidates_only() -> None:
    tower = _dropout_tower(0)
    ids = np.arange(1, 201)
    full = np.asarray(tower(ids))
    np.testing.assert_allclose(full, np.asarray(tower.embedding(ids)) + np.asarray(tower.attributes(ids)), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(tower.candidates(ids, training=False)), full)
    # the history a user tower reads in training (Keras passes training down) keeps its ids
    np.testing.assert_array_equal(np.asarray(tower(ids, training=True)), full)
    dropped = _dropped_rows(tower, ids)
    assert 60 <= dropped.sum() <= 140  # Binomial(200, 0.5): 100 ± 7 (std), far from both ends
    assert ItemTower.from_config(tower.get_config()).id_dropout == 0.5


def test_id_dropout_follows_the_training_seed() -> None:
    ids = np.arange(1, 201)
    first, again, other = (_dropped_rows(_dropout_tower(s), ids) for s in (1, 1, 2))
    np.testing.assert_array_equal(first, again)
    assert (first != other).sum() > 20  # two independent masks differ in ~100 of 200 rows


def test_id_dropout_needs_attributes() -> None:
    with pytest.raises(ValueError, match="needs attributes"):
        ItemTower(10, 4, id_dropout=0.3)
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        ItemTower(10, 4, num_attributes=2, max_attributes=1, id_dropout=1.0)


def test_cold_vectors_are_the_trained_item_towers_attribute_part(deployed: Path) -> None:
    """The exported attribute table and ``cold_vectors`` give what the Keras item tower gives."""
    model_dir, _ = deployment_dirs(deployed)
    full = keras.saving.load_model(model_dir / "model.keras")
    model = load_model(model_dir)
    assert model.attribute_embeddings is not None
    attributes = json.loads((model_dir / "item_attributes.json").read_text())
    ids = list(model.vocab.ids[:12])
    expected = np.asarray(full.item_tower.attributes(model.vocab.lookup(ids)))
    got = cold_vectors(model.side, model.attribute_embeddings, [attributes[i] for i in ids])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # Unknown attributes are skipped; an item with none known has no vector.
    np.testing.assert_allclose(
        cold_vectors(model.side, model.attribute_embeddings, [[*attributes[ids[0]], "never-seen"]]), got[:1]
    )
    with pytest.raises(ValueError, match="1 items have no attribute the model knows"):
        cold_vectors(model.side, model.attribute_embeddings, [["never-seen"]])


# --- add-items through a watching server -----------------------------------------------------------


def test_added_items_are_served_and_removed_ones_never_come_back(deployed: Path, tmp_path: Path) -> None:
    root = _copy_root(deployed, tmp_path)
    before = load_deployment(root)
    items = _write_items(
        tmp_path / "new.jsonl",
        [
            {"id": "new-c0", "attributes": ["0", "99"], "title": "A cluster-0 newcomer"},
            {"id": "new-c2", "attributes": ["2"]},
        ],
    )
    removed = ["2", "3", "24"]
    (tmp_path / "gone.txt").write_text("\n".join(removed) + "\n")
    cluster_0 = [str(i) for i in range(4, 10)]
    with ReloadUnderLoad(root, callers=2, retries=0) as live:
        initial = live.slot.current
        live.wait_for_calls(10)
        code = run_tool(
            "add_items", "--root", str(root), "--items", str(items), "--remove", str(tmp_path / "gone.txt")
        )
        assert code == 0
        version = load_model(deployment_dirs(root)[0], verify=False).version
        live.settles_on(version)
        served = live.slot.current
        # The user tower was lent by the version in service, not loaded again.
        assert served.model.user_vectors is initial.model.user_vectors
        everything = len(served.model.vocab) - 1
        with connected(live.address) as client:  # through the server
            with_new = client.retrieve(cluster_0, k=5, allow=["new-c0"])
            assert [i for i, _, _ in with_new.items] == ["new-c0"]
            assert with_new.model_version == version
            found = {i for i, _, _ in client.retrieve(["1"], k=everything).items}
            assert {"new-c0", "new-c2"} <= found and not found & set(removed)
            assert not client.retrieve(["1"], k=5, allow=removed).items
            # A history of an added item alone: the tower does not read it.
            with pytest.raises(Exception, match="added after training"):
                client.retrieve(["new-c0"], k=5)
        live.stop_calls()
        assert not live.errors
    # A restart serves the same catalogue, and so does a rebuilt index (removed items stay out).
    restarted = open_deployment(root).current
    assert len(restarted.model.vocab) == len(before.model.vocab) + 2
    assert (
        restarted.model.vocab.title(int(restarted.model.vocab.lookup(["new-c0"])[0]))
        == "A cluster-0 newcomer"
    )
    rebuilt = build_index_from_model(restarted.model)
    assert set(restarted.model.vocab.lookup(removed).tolist()).isdisjoint(rebuilt.ids().tolist())


def test_a_cold_item_is_near_the_items_that_share_its_attributes(deployed: Path, tmp_path: Path) -> None:
    """Its cluster's items score it above the other clusters' cold newcomers. More items are
    added than a history holds (the warm-up reads only items the tower knows)."""
    root = _copy_root(deployed, tmp_path)
    fillers = [CatalogueItem(f"filler-{i}", ("99",)) for i in range(16)]
    change_catalogue(root, [CatalogueItem(f"new-c{c}", (str(c), "99")) for c in range(CLUSTERS)] + fillers)
    served = load_deployment(root)
    newcomers = [f"new-c{c}" for c in range(CLUSTERS)]
    hits = 0
    for c in range(CLUSTERS):
        history = [str(c * PER_CLUSTER + s + 1) for s in range(4)]
        top = served.retrieve(history, k=1, allow=newcomers).items[0][0]
        hits += top == f"new-c{c}"
    assert hits >= 3, f"only {hits} of {CLUSTERS} clusters rank their own newcomer first"


def test_updates_keep_a_trained_items_id_part_and_removal_is_undone_by_adding(
    deployed: Path, tmp_path: Path
) -> None:
    root = _copy_root(deployed, tmp_path)
    before = load_deployment(root).model
    change_catalogue(root, remove=["6"])
    change_catalogue(root, [CatalogueItem("6", ("3", "99"))])
    after = load_model(deployment_dirs(root)[0])
    assert len(after.removed) == 0
    i5 = int(before.vocab.lookup(["6"])[0])
    assert after.attribute_embeddings is not None
    old_part = cold_vectors(before.side, after.attribute_embeddings, [["0", "99"]])[0]
    new_part = cold_vectors(before.side, after.attribute_embeddings, [["3", "99"]])[0]
    np.testing.assert_allclose(
        after.item_embeddings[i5], before.item_embeddings[i5] - old_part + new_part, rtol=1e-5, atol=1e-6
    )
    assert after.manifest["tower_items"] == len(before.vocab) == len(after.vocab)


def test_bad_changes_leave_the_root_unchanged(
    deployed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy_root(deployed, tmp_path)
    current = resolve_current(root)
    cases = {
        "unknown-remove": ([], "nope\n", "1 ids to remove are not in the catalogue"),
        "no-attribute": ([{"id": "x", "attributes": ["never-seen"]}], None, "no attribute the model knows"),
        "both": ([{"id": "5", "attributes": ["0"]}], "5\n", "both added and removed"),
    }
    for name, (items, remove, message) in cases.items():
        args = ["--root", str(root)]
        if items:
            args += ["--items", str(_write_items(tmp_path / f"{name}.jsonl", items))]
        if remove:
            (tmp_path / f"{name}.txt").write_text(remove)
            args += ["--remove", str(tmp_path / f"{name}.txt")]
        assert run_tool("add_items", *args) == 2, name
        err = capsys.readouterr().err
        assert message in err and "unchanged" in err and err.count("\n") == 1, err
        assert resolve_current(root) == current
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "attributes": ["0"]}\n{"id": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: "):
        read_items(tmp_path / "bad.jsonl")


def test_a_model_without_attributes_refuses_cold_start(attributes_data: Path, tmp_path: Path) -> None:
    model_dir = _train(attributes_data, tmp_path / "ids-only")
    assert run_tool("build_index", "--model", str(model_dir), "--out", str(tmp_path / "index")) == 0
    publish_deployment(model_dir, tmp_path / "index", tmp_path / "live")
    with pytest.raises(ArtifactError, match="trained without item attributes"):
        change_catalogue(tmp_path / "live", [CatalogueItem("x", ("0",))])


def test_a_ranker_reads_items_added_after_it_as_unknown() -> None:
    trained = ItemVocab(("a", "b"))
    check_same_vocab(Path("ranker"), trained, ItemVocab(("a", "b", "new")))  # grown: accepted
    with pytest.raises(ArtifactError, match="another item vocabulary"):
        check_same_vocab(Path("ranker"), trained, ItemVocab(("b", "a", "new")))

    class Scorer:
        def score(self, histories, candidates, unclicked, retrieval_scores):  # type: ignore[no-untyped-def]
            self.seen = (histories, candidates, unclicked)
            return np.zeros(candidates.shape, np.float32)

    ranker = LoadedRanker(Path("ranker"), {}, trained, Scorer())  # type: ignore[arg-type]
    ranker.score([np.array([1, 3])], np.array([[2, 3, 1]]), [np.array([3])])
    histories, candidates, unclicked = ranker.scorer.seen  # type: ignore[attr-defined]
    assert (
        histories[0].tolist() == [1, 0]
        and candidates.tolist() == [[2, 0, 1]]
        and unclicked[0].tolist() == [0]
    )
