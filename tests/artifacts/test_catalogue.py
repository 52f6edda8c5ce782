"""A living catalogue: cold-start vectors from attributes, ``mitt add-items`` publishing a
version that a watching server swaps in, removed items never coming back."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import keras
import numpy as np
import pytest

from retrieval.artifacts.catalogue import CatalogueItem, change_catalogue, cold_vectors, read_items
from retrieval.artifacts.categories import Categories
from retrieval.artifacts.changes import CatalogueChanges
from retrieval.artifacts.deployment import deployment_dirs, publish_deployment
from retrieval.artifacts.index import build_index_from_model
from retrieval.artifacts.model import load_model
from retrieval.artifacts.ranker import LoadedRanker, check_same_vocab
from retrieval.config import config_to_json
from retrieval.data.vocab import ItemVocab
from retrieval.serving.reload import load_deployment, open_deployment
from retrieval.serving.retriever import Retriever
from retrieval.storage.manifest import ArtifactError, read_manifest
from retrieval.storage.versions import resolve_current, version_folders
from retrieval.training.config import Config, ModelConfig
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
    # The library's defaults (a dot-product model), not the sasrec preset's; cosine by options.
    defaults = out.parent / f"{out.name}-config.json"
    defaults.write_text(config_to_json(Config(model=ModelConfig(tower="sasrec"))))
    code = run_tool(
        "train", "--data", str(data), "--config", str(defaults), "--out", str(out), "--epochs", "8",
        "--dim", "16", "--max-len", "12", "--seed", "1", "--quiet", *options,
    )  # fmt: skip
    assert code == 0
    return out


def _deploy(data: Path, out: Path, *options: str) -> Path:
    """A model trained with attributes and id-dropout, its Flat index, as a deployment root. One
    transformer block (the default's two take ~3 s more to build): the catalogue reads the item
    tower's tables, and one block learns the clusters as well."""
    model_dir = _train(
        data, out / "model", "--set", "model.side_features=attributes", "--set", "model.fusion=nova",
        "--set", "model.id_dropout=0.5", "--set", "model.num_blocks=1", *options,
    )  # fmt: skip
    assert run_tool("build_index", "--model", str(model_dir), "--out", str(out / "index")) == 0
    publish_deployment(model_dir, out / "index", out / "live")
    return out / "live"


@pytest.fixture(scope="module")
def deployed(attributes_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dot-product model (:func:`_deploy`)."""
    return _deploy(attributes_data, tmp_path_factory.mktemp("catalogue"))


@pytest.fixture(scope="module")
def cosine_deployed(attributes_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cosine model (:func:`_deploy`), as the ``sasrec`` presets train."""
    out = tmp_path_factory.mktemp("cosine")
    return _deploy(attributes_data, out, "--set", "model.similarity=cosine", "--set", "train.temperature=0.1")


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
    np.testing.assert_allclose(
        full, np.asarray(tower.embedding(ids)) + np.asarray(tower.attributes(ids)), rtol=1e-6
    )
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
    # A cosine model's cold vectors are at unit length, as its item_embeddings are.
    unit = cold_vectors(model.side, model.attribute_embeddings, [attributes[i] for i in ids], "cosine")
    np.testing.assert_allclose(unit, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-5)


# --- add-items through a watching server -----------------------------------------------------------


@pytest.mark.parametrize("whole", [False, True], ids=["changes", "compact"])
def test_added_items_are_served_and_removed_ones_never_come_back(
    deployed: Path, tmp_path: Path, whole: bool
) -> None:
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
            "add_items", "--root", str(root), "--items", str(items), "--remove", str(tmp_path / "gone.txt"),
            *(["--compact"] if whole else []),
        )  # fmt: skip
        assert code == 0
        version = load_model(deployment_dirs(root)[0], verify=False).version
        live.settles_on(version)
        served = live.slot.current
        # The user tower was lent by the version in service, not loaded again; so were the
        # catalogue and the index, changes applied to a copy, unless the version was whole.
        assert served.model.user_vectors is initial.model.user_vectors
        assert served.model.grown_from == (None if whole else initial.model_version)
        assert initial.index.ntotal == len(before.model.vocab) and served.index is not initial.index
        _assert_same_retriever(served, load_deployment(root))
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


def _partition(codes: np.ndarray) -> np.ndarray:
    """Each row's code renamed to the first row that has it: equal for equal partitions."""
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    return first[inverse]


def _assert_same_retriever(a: Retriever, b: Retriever) -> None:
    """``a`` (changes applied over the version before) serves what ``b`` (read whole) serves."""
    assert a.model.vocab == b.model.vocab and a.model.vocab.titles == b.model.vocab.titles
    np.testing.assert_array_equal(a.model.item_embeddings, b.model.item_embeddings)
    np.testing.assert_array_equal(a.model.removed, b.model.removed)
    np.testing.assert_array_equal(np.sort(a.index.ids()), np.sort(b.index.ids()))
    np.testing.assert_array_equal(_partition(a.categories.codes), _partition(b.categories.codes))
    assert a.categories.names.keys() == b.categories.names.keys()
    assert a.categories.attributes == b.categories.attributes
    members_a, members_b = a.categories.members.ids_by_category, b.categories.members.ids_by_category
    assert members_a.keys() == members_b.keys()
    for name in members_a:
        np.testing.assert_array_equal(members_a[name], members_b[name])
    queries = np.random.default_rng(0).normal(size=(5, a.model.dim)).astype(np.float32)
    for (sa, ia), (sb, ib) in [(a.index.search(queries, 10), b.index.search(queries, 10))]:
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_allclose(sa, sb, rtol=1e-5)


def test_changes_over_changes_match_the_version_read_whole(deployed: Path, tmp_path: Path) -> None:
    """Three layered changes (adds, an update, a removal, a re-add), each applied by a server
    over the version before, serve what a fresh read serves; a compaction then carries no
    change files and the next change starts from it."""
    root = _copy_root(deployed, tmp_path)
    served = load_deployment(root)
    model_dir = deployment_dirs(root)[0]
    base_files = {
        p.name: p.stat().st_ino for p in model_dir.iterdir() if p.is_file() and p.name != "manifest.json"
    }
    steps = [
        ([CatalogueItem("n1", ("0", "99"), "one"), CatalogueItem("n2", ("1",))], ["7"]),
        ([CatalogueItem("n1", ("2",)), CatalogueItem("5", ("3", "99"))], ["n2", "8"]),
        (
            [
                CatalogueItem("n2", ("1", "99"), "two"),
                CatalogueItem("7", ("0",)),
                CatalogueItem("n3", ("3",)),
            ],
            [],
        ),
    ]
    for items, remove in steps:
        change = change_catalogue(root, items, remove, compact=False)
        assert not change.compacted
        new = load_deployment(root, reuse=served)
        assert new.model.grown_from == served.model_version
        _assert_same_retriever(new, load_deployment(root))
        served = new
    model_dir = deployment_dirs(root)[0]
    assert {p.name: p.stat().st_ino for p in model_dir.iterdir() if p.name in base_files} == base_files
    vocab = served.model.vocab
    assert vocab.ids[-3:] == ("n1", "n2", "n3") and vocab.title(int(vocab.lookup(["n2"])[0])) == "two"
    assert set(vocab.external(served.model.removed)) == {"8"}
    assert served.categories.attributes["n1"] == ["2"]

    change = change_catalogue(root, compact=True)
    model_dir, index_dir = deployment_dirs(root)
    assert change.compacted and not (model_dir / "catalogue_changes.json").exists()
    assert not (index_dir / "changes.npz").exists()
    whole = load_deployment(root, reuse=served)
    assert whole.model.grown_from is None and whole.model.changes is None
    _assert_same_retriever(whole, served)
    change_catalogue(root, [CatalogueItem("n4", ("1",))], compact=False)
    after = load_deployment(root, reuse=whole)
    assert after.model.grown_from == whole.model_version and len(after.model.changes or ()) == 1
    _assert_same_retriever(after, load_deployment(root))


def test_a_tampered_change_file_is_refused(deployed: Path, tmp_path: Path) -> None:
    root = _copy_root(deployed, tmp_path)
    change_catalogue(root, [CatalogueItem("n1", ("0",))], compact=False)
    changes = deployment_dirs(root)[0] / "catalogue_changes.json"
    text = changes.read_text()
    changes.unlink()  # a hard link would not be shared; rewrite it as another file
    changes.write_text(text.replace('"n1"', '"n9"'))
    with pytest.raises(ArtifactError, match=r"catalogue_changes\.json"):
        load_deployment(root)


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


# --- a cosine model: new items, removals, and updates that keep a trained item's attribute part ----


def _unit_attribute_mean(model_dir: Path, attributes: list[str]) -> np.ndarray:
    """The reference cold vector: the unit-length mean of the attributes' rows in the folder."""
    names = json.loads((model_dir / "side_vocab.json").read_text())["attributes"]
    rows = [names.index(a) + 1 for a in attributes]  # row 0 is padding
    mean = np.load(model_dir / "attribute_embeddings.npy")[rows].mean(axis=0)
    return mean / np.linalg.norm(mean)


@pytest.mark.slow  # trains and deploys its own cosine model: ~10 s
def test_a_cosine_model_serves_an_added_item_at_the_unit_mean_of_its_attributes(
    cosine_deployed: Path, tmp_path: Path
) -> None:
    root = _copy_root(cosine_deployed, tmp_path)
    assert load_deployment(root).model.similarity == "cosine"
    change = change_catalogue(root, [CatalogueItem("new-c1", ("1", "99"), "A cluster-1 newcomer")])
    assert (change.added, change.updated) == (1, 0)
    served = load_deployment(root)
    row = served.model.item_embeddings[int(served.model.vocab.lookup(["new-c1"])[0])]
    np.testing.assert_allclose(row, _unit_attribute_mean(deployment_dirs(root)[0], ["1", "99"]), rtol=1e-5)
    found = served.retrieve(["11", "12", "13"], k=1, allow=["new-c1"]).items
    assert [i for i, _, _ in found] == ["new-c1"] and -1 - 1e-5 <= found[0][1] <= 1 + 1e-5


def test_a_cosine_model_removes_an_item_from_the_index(cosine_deployed: Path, tmp_path: Path) -> None:
    root = _copy_root(cosine_deployed, tmp_path)
    assert load_deployment(root).retrieve(["1"], k=5, allow=["24"]).items  # served before
    change_catalogue(root, remove=["24"])
    served = load_deployment(root)
    assert int(served.model.vocab.lookup(["24"])[0]) not in served.index.ids().tolist()
    assert not served.retrieve(["1"], k=5, allow=["24"]).items


def test_a_cosine_model_keeps_a_trained_items_vector_when_its_attributes_stay(
    cosine_deployed: Path, tmp_path: Path
) -> None:
    """A title-only update, and a removal undone by adding the item back with its attributes
    in another order: both keep the trained (unit-length) row exactly."""
    root = _copy_root(cosine_deployed, tmp_path)
    before = load_deployment(root).model
    change = change_catalogue(root, [CatalogueItem("6", ("0", "99"), "Six")])
    assert (change.added, change.updated) == (0, 1)
    change_catalogue(root, remove=["7"])
    change_catalogue(root, [CatalogueItem("7", ("99", "0"))])
    after = load_deployment(root).model
    rows = before.vocab.lookup(["6", "7"])
    np.testing.assert_array_equal(after.item_embeddings[rows], before.item_embeddings[rows])
    assert after.vocab.title(int(rows[0])) == "Six" and len(after.removed) == 0


def test_a_cosine_model_refuses_new_attributes_for_a_trained_item(
    cosine_deployed: Path, tmp_path: Path
) -> None:
    root = _copy_root(cosine_deployed, tmp_path)
    current = resolve_current(root)
    items = [CatalogueItem("fresh", ("1",)), CatalogueItem("6", ("0", "99")), CatalogueItem("5", ("3", "99"))]
    with pytest.raises(ValueError, match=r"1 trained items would change attributes, e\.g\. '5'") as refused:
        change_catalogue(root, items)
    for why_and_instead in ("scores by cosine", "unit length", "new id", "--set model.similarity=dot"):
        assert why_and_instead in str(refused.value)
    assert resolve_current(root) == current  # nothing published, not even the new item


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


def test_a_model_without_attributes_removes_items_but_refuses_cold_start(
    model_versions: list[tuple[Path, Path, str]], tmp_path: Path
) -> None:
    """Removal needs no vector (it used to be refused with "cannot embed items it never saw").
    What is checked holds for any tower and any training: the session's one-epoch YouTube DNN
    (conftest's ``model_versions``, items ``i0``..``i39`` of a log without attributes)."""
    model_dir, index_dir, _ = model_versions[0]
    root = tmp_path / "live"
    publish_deployment(model_dir, index_dir, root)
    with pytest.raises(ArtifactError, match="trained without item attributes, so it cannot embed items"):
        change_catalogue(root, [CatalogueItem("x", ("0",))])
    assert change_catalogue(root, remove=["i5", "i24"]).removed == 2
    for compacted in (False, True):
        served = load_deployment(root)
        assert not served.retrieve(["i1"], k=5, allow=["i5", "i24"]).items
        assert [i for i, _, _ in served.retrieve(["i1"], k=5, allow=["i6"]).items] == ["i6"]
        if not compacted:
            assert change_catalogue(root, compact=True).compacted
    whole = set(read_manifest(deployment_dirs(root)[0], "model")["files"])
    assert whole == {*read_manifest(model_dir, "model")["files"], "removed_items.json"}  # written whole


# --- writers at the same time, and changes that change nothing -----------------------------------


def _changed(root: Path) -> tuple[set[str], set[str]]:
    """(ids the current version's changes add or update, ids they remove)."""
    changes = CatalogueChanges.load(deployment_dirs(root)[0], 16)
    pairs = list(zip(changes.ids, changes.removed, strict=True))
    return {i for i, out in pairs if not out}, {i for i, out in pairs if out}


def _held_change(root: Path, items: list[CatalogueItem], remove: list[str]) -> Path:
    """:func:`change_catalogue`, held 20 ms inside its publication (its check); the version."""
    return change_catalogue(
        root, items, remove, check=lambda _: time.sleep(0.02), compact=False, grace=0
    ).folder


def _signal_then_wait(event: threading.Event) -> Callable[[Path], None]:
    """A deploy check that sets ``event`` and takes 0.2 s."""

    def check(_: Path) -> None:
        event.set()
        time.sleep(0.2)

    return check


@pytest.mark.slow  # 20 rounds of 3 changes: ~10 s here
def test_changes_made_at_the_same_time_are_all_published(deployed: Path, tmp_path: Path) -> None:
    """Three writers at a time, each held 20 ms inside its publication (its check): without the
    lock they read the same version and the last one published lost the others' changes. Each
    version is published over the one before (its model names that one's as previous)."""
    root = _copy_root(deployed, tmp_path)
    added: set[str] = set()
    removed: set[str] = set()
    for round_ in range(20):
        items = [f"r{round_}-a", f"r{round_}-b"]
        gone = str(round_ + 1)  # a trained item
        changes = [
            ([CatalogueItem(items[0], ("1",))], []),
            ([CatalogueItem(items[1], ("2",))], []),
            ([], [gone]),
        ]
        with ThreadPoolExecutor(3) as pool:
            folders = sorted(pool.map(lambda c: _held_change(root, *c), changes), key=lambda f: f.name)
        added |= set(items)
        removed.add(gone)
        assert _changed(root) == (added, removed), round_
        models = [read_manifest(f / "model", "model", verify=False) for f in folders]
        assert [m["previous_version"] for m in models[1:]] == [m["version"] for m in models[:-1]], round_


def test_a_change_made_during_a_deploy_changes_the_deployed_model(
    deployed: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A change started while a deploy checks its version waits for it (saying so), then applies
    to the deployed model: it used to read the version before, and either published it back
    over the deploy or was lost under it."""
    root = _copy_root(deployed, tmp_path)
    model_dir, index_dir = deployment_dirs(deployed)
    version = read_manifest(model_dir, "model", verify=False)["version"]
    for round_ in range(10):
        checking = threading.Event()
        caplog.clear()
        with ThreadPoolExecutor(1) as pool:
            check = _signal_then_wait(checking)
            deploying = pool.submit(publish_deployment, model_dir, index_dir, root, grace=0, check=check)
            assert checking.wait(60)
            with caplog.at_level(logging.WARNING, logger="retrieval.storage.versions"):
                change = change_catalogue(root, remove=[str(round_ + 1)], compact=False, grace=0)
            deployed_folder = deploying.result()
        assert change.folder.name > deployed_folder.name and resolve_current(root) == change.folder.resolve()
        assert read_manifest(change.folder / "model", "model", verify=False)["previous_version"] == version
        assert _changed(root) == (set(), {str(round_ + 1)}), round_  # the deploy reset the others
        assert [r.getMessage() for r in caplog.records if "waiting for another writer" in r.getMessage()]


def test_an_id_removed_already_is_reported_as_such(
    deployed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Removing ids that are out already is not counted as removing them; when that is the whole
    change, nothing is published (exit code 2), before and after the removal is compacted into
    the base files."""
    root = _copy_root(deployed, tmp_path)
    first = change_catalogue(root, remove=["6"], compact=False)
    assert (first.removed, first.already_removed) == (1, 0)
    (tmp_path / "gone.txt").write_text("6\n7\n")
    capsys.readouterr()
    assert run_tool("add_items", "--root", str(root), "--remove", str(tmp_path / "gone.txt")) == 0
    assert "1 removed (1 removed already)," in capsys.readouterr().out
    for compact in (False, True):
        current, versions = resolve_current(root), version_folders(root)
        assert run_tool("add_items", "--root", str(root), "--remove", str(tmp_path / "gone.txt")) == 2
        err = capsys.readouterr().err
        assert "nothing to publish: the 2 ids to remove are removed already" in err and "unchanged" in err
        assert resolve_current(root) == current and version_folders(root) == versions
        if not compact:
            change_catalogue(root, compact=True)
    assert _removed_ids(root) == {"6", "7"}


def _removed_ids(root: Path) -> set[str]:
    model = load_deployment(root).model
    return set(model.vocab.external(model.removed))


@pytest.mark.parametrize("empty", ["items", "remove", "nothing"])
def test_an_empty_change_publishes_nothing(
    deployed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], empty: str
) -> None:
    """An empty file (an export that failed?) used to publish a version identical to the current
    one, pushing an older one out of ``--keep``."""
    root = _copy_root(deployed, tmp_path)
    current, versions = resolve_current(root), version_folders(root)
    if empty == "nothing":
        with pytest.raises(ValueError, match="nothing to publish: no item to add or remove"):
            change_catalogue(root)
    else:
        (tmp_path / "empty").write_text("\n \n")  # blank lines only
        capsys.readouterr()
        assert (
            run_tool("add_items", "--root", str(root), f"--{empty}", str(tmp_path / "empty"), "--keep", "1")
            == 2
        )
        err = capsys.readouterr().err
        assert f"nothing to publish: {tmp_path / 'empty'} is empty" in err and err.count("\n") == 1, err
    assert resolve_current(root) == current and version_folders(root) == versions


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


# --- the change format ----------------------------------------------------------------------------


def test_categories_changed_item_by_item_equal_categories_built_whole() -> None:
    """Random rounds of attribute changes (new items, changed and emptied attributes) applied
    to the categories of the round before give the categories built from scratch."""
    rng = np.random.default_rng(0)
    values = ["a", "b", "c", "d"]

    def draw(n: int) -> list[str]:
        return [str(v) for v in rng.choice(values, size=n, replace=False)]

    attributes = {str(i): draw(int(rng.integers(0, 3))) for i in range(30)}
    vocab = ItemVocab.from_ids([*attributes, "no-attributes"])
    categories = Categories.of(vocab, attributes)
    for round_ in range(5):
        changed = {str(i): draw(int(rng.integers(0, 3))) for i in rng.choice(40, size=8, replace=False)}
        vocab = vocab.extended(list(changed))
        attributes = {**attributes, **changed}
        categories = categories.changed(vocab, changed)
        whole = Categories.of(vocab, attributes)
        np.testing.assert_array_equal(_partition(categories.codes), _partition(whole.codes))
        assert categories.attributes == whole.attributes
        got, want = categories.members.ids_by_category, whole.members.ids_by_category
        assert got.keys() == want.keys(), round_
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_changes_keep_first_places_and_last_states() -> None:
    none = CatalogueChanges.none(2)
    first = none.then(
        [CatalogueItem("x", ("a",), "X"), CatalogueItem("y", ("b",))], np.eye(2, dtype=np.float32), ["z"]
    )
    second = first.then(
        [CatalogueItem("y", ("c",)), CatalogueItem("w", ("a",))], 2 * np.eye(2, dtype=np.float32), ["x"]
    )
    assert second.ids == ["x", "y", "z", "w"] and second.extends(first) and not first.extends(second)
    np.testing.assert_array_equal(second.removed, [True, False, True, False])
    assert second.items[0] == CatalogueItem("x", ("a",), "X")  # removal keeps the last state
    np.testing.assert_array_equal(second.vectors[0], [1, 0])
    np.testing.assert_array_equal(second.has_vector, [True, True, False, True])
    assert second.since(first).ids == ["x", "y", "w"]  # z: removed in both, the same
    assert second.since(second).ids == [] and second.since(CatalogueChanges.none(2)).ids == second.ids
    assert second.then([CatalogueItem("x", ("d",))], np.ones((1, 2), np.float32), []).items[0].title == "X"
    assert CatalogueChanges.none(2).then([], np.zeros((0, 2), np.float32), ["y", "x"]).extends(none)
    assert not first.extends(CatalogueChanges.none(2).then([], np.zeros((0, 2), np.float32), ["y"]))


def test_an_update_reads_the_item_table_only_verified(deployed: Path, tmp_path: Path) -> None:
    """A new item needs none of the large files; updating a trained item reads its row, and a
    corrupted table is refused rather than turned into its new vector."""
    root = _copy_root(deployed, tmp_path)
    table = deployment_dirs(root)[0] / "item_embeddings.npy"
    data = bytearray(table.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"  # the last value becomes +inf
    table.unlink()  # a hard link of the trained model's file: write another one
    table.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"item_embeddings\.npy does not match its checksum"):
        change_catalogue(root, [CatalogueItem("5", ("1",))])
    assert change_catalogue(root, [CatalogueItem("fresh", ("1",))], compact=False).added == 1


def test_a_compaction_refuses_a_damaged_base_file(deployed: Path, tmp_path: Path) -> None:
    root = _copy_root(deployed, tmp_path)
    change_catalogue(root, [CatalogueItem("fresh", ("1",))], compact=False)
    current = resolve_current(root)
    table = deployment_dirs(root)[0] / "item_embeddings.npy"
    data = bytearray(table.read_bytes())
    data[-4:] = b"\x00\x00\x80\x3f"  # the last value becomes 1.0: finite, only the checksum tells
    table.unlink()  # a hard link of the trained model's file: write another one
    table.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"item_embeddings\.npy"):
        change_catalogue(root, compact=True)
    assert resolve_current(root) == current
