"""ItemVocab against a plain dict (the mapping it replaced), on random and adversarial ids."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from retrieval.data import vocab as vocab_module
from retrieval.data.vocab import PAD, ItemVocab

ADVERSARIAL = [
    "a",
    "ab",  # "a" is its prefix, "abc" extends it
    "abc",
    "",  # allowed, as before: a key NumPy stores like the padding row
    "ab\0",  # NumPy drops trailing NUL bytes: must not be "ab"
    "a\0b",
    "café",
    "商品-42",
    "😀",
    "\ud800",  # a lone surrogate, as JSON may carry
    "x" * 300,  # far longer than the others: kept aside, not widening every key
    "x" * 301,
    "item" + "9" * 40,
]
UNKNOWN = ["abcd", "ab\0\0", "\0", "x" * 299, "x" * 302, "x" * 5000, "cafe", "商品", "😀😀", "item", " a"]


def random_ids(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct ids of 1..30 characters, some of them not ASCII."""
    alphabet = np.array(list("abcXYZ019-_é商😀"))
    ids = ("".join(alphabet[rng.integers(0, len(alphabet), rng.integers(1, 31))]) for _ in range(3 * n))
    return list(dict.fromkeys(ids))[:n]


def mixed_ids(seed: int, n: int) -> list[str]:
    """The adversarial ids, then random ones."""
    return list(dict.fromkeys([*ADVERSARIAL, *random_ids(np.random.default_rng(seed), n)]))


def reference(ids: list[str], queries: list[str]) -> list[int]:
    """What the dict-based vocabulary returned: 1-based position, PAD when absent."""
    index = {item: n + 1 for n, item in enumerate(ids)}
    return [index.get(q, PAD) for q in queries]


@pytest.mark.parametrize("n", [0, 1, 7, 2_000])
def test_lookup_matches_a_dict_on_random_ids(n: int) -> None:
    rng = np.random.default_rng(n)
    ids = random_ids(rng, n)
    vocab = ItemVocab(ids)
    others = [i + "?" for i in ids[:50]] + [i[:-1] for i in ids[:50]] + random_ids(rng, 200)
    queries = ids + others
    rng.shuffle(queries)
    assert vocab.lookup(queries).tolist() == reference(ids, queries)
    assert vocab.lookup(queries).dtype == np.int64
    assert len(vocab) == n and vocab.num_embeddings == n + 1


def test_lookup_matches_a_dict_on_adversarial_ids() -> None:
    ids = [*ADVERSARIAL, *(f"item{i}" for i in range(100))]
    vocab = ItemVocab(ids)
    queries = ids + UNKNOWN + [s[::-1] for s in ids]
    assert vocab.lookup(queries).tolist() == reference(ids, queries)
    assert vocab.lookup(UNKNOWN).tolist() == [PAD] * len(UNKNOWN)
    for item in ids:
        assert item in vocab
    assert "ab\0" in vocab and "ab\0\0" not in vocab and "x" * 302 not in vocab


def test_lookup_of_what_is_not_a_string_is_padding() -> None:
    vocab = ItemVocab(["1", "b"])
    assert vocab.lookup([1, "b", b"b", None]).tolist() == [PAD, 2, PAD, PAD]  # type: ignore[list-item]
    assert vocab.lookup([]).tolist() == []
    assert 1 not in vocab  # type: ignore[operator]


def test_lookup_without_a_table_finds_every_id_kept_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids the cuckoo table fails to place are found through the dict kept beside it."""
    monkeypatch.setattr(vocab_module, "_ROUNDS", 0)  # no round: the table places nothing
    ids = mixed_ids(1, 300)
    vocab = ItemVocab(ids)
    queries = ids + UNKNOWN
    assert vocab.lookup(queries).tolist() == reference(ids, queries)


def test_one_long_id_does_not_widen_every_key() -> None:
    ids = [f"item{i}" for i in range(1_000)] + ["y" * 10_000]
    vocab = ItemVocab(ids)
    assert vocab._keys.itemsize == len("item999")  # the long id is kept as a Python string
    assert vocab.lookup(["y" * 10_000, "y" * 9_999, "item999"]).tolist() == [1_001, PAD, 1_000]
    assert vocab.external([1_001, 1]) == ["y" * 10_000, "item0"]


def test_external_round_trips_and_refuses_indices_outside_the_vocabulary() -> None:
    ids = mixed_ids(2, 500)
    vocab = ItemVocab(ids)
    order = np.random.default_rng(3).permutation(len(ids)) + 1
    assert vocab.external(order) == [ids[i - 1] for i in order]
    assert vocab.external(vocab.lookup(ids)) == ids
    assert vocab.external([]) == []
    assert vocab.ids == tuple(ids)
    for bad in (0, len(ids) + 1, -1):
        with pytest.raises(IndexError, match=str(bad)):
            vocab.external([1, bad])


def test_construction_refuses_duplicates_non_strings_and_misaligned_titles() -> None:
    with pytest.raises(ValueError, match="unique"):
        ItemVocab(["a", "b", "a"])
    with pytest.raises(ValueError, match="unique"):
        ItemVocab(["x" * 500, "x" * 500])  # kept aside, still checked
    with pytest.raises(TypeError, match="ids must be strings"):
        ItemVocab(["a", 1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="titles must be strings"):
        ItemVocab(["a"], [None])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="1 titles for 2 items"):
        ItemVocab(["a", "b"], ["A"])
    assert ItemVocab.from_ids(["a", "b", "a", 3]).ids == ("a", "b", "3")  # type: ignore[list-item]


def test_extended_keeps_old_indices_and_appends_new_ids_in_order() -> None:
    ids = ["a", "b", "x" * 300]
    vocab = ItemVocab(ids)
    new = [f"n{i}" for i in range(200)]  # past the table's load: the table is rebuilt bigger
    grown = vocab.extended(["b", *new, "n0", "y" * 400, ""])
    expected = [*ids, *new, "y" * 400, ""]
    assert grown.ids == tuple(expected)
    queries = expected + UNKNOWN
    assert grown.lookup(queries).tolist() == reference(expected, queries)
    assert vocab.lookup(["n0"]).tolist() == [PAD] and len(vocab) == 3  # the original is unchanged
    assert grown.first_difference(vocab) is None and vocab.first_difference(grown) is None
    assert grown.extended([]) == grown


def test_extended_titles_replace_and_default_to_ids() -> None:
    vocab = ItemVocab.from_ids(["a", "b"])
    assert vocab.extended(["c"]).titles is None
    grown = vocab.extended(["c", "d"], {"a": "Apple", "d": "Date"})
    assert grown.titles == ("Apple", "b", "c", "Date")
    regrown = grown.extended(["e"], {"b": "Banana"})
    assert regrown.titles == ("Apple", "Banana", "c", "Date", "e")
    assert [regrown.title(i) for i in range(1, 6)] == list(regrown.titles)
    with pytest.raises(KeyError, match="zz"):
        vocab.extended(["c"], {"zz": "?"})


def test_titles_default_to_ids_and_index_like_a_tuple() -> None:
    vocab = ItemVocab.from_ids(["a", "b", "é"], {"a": "Apple", "é": "Été 😀"})
    assert vocab.titles == ("Apple", "b", "Été 😀")
    assert [vocab.title(i) for i in (1, 2, 3)] == ["Apple", "b", "Été 😀"]
    assert vocab.title(0) == "Été 😀"  # index 0 is the tuple's last, as before
    with pytest.raises(IndexError):
        vocab.title(4)
    untitled = ItemVocab.from_ids(["a", "b"])
    assert untitled.titles is None and untitled.title(2) == "b"


def test_equality_compares_ids_and_titles_however_built() -> None:
    ids = ["a", "b", "x" * 300, ""]
    assert ItemVocab(ids) == ItemVocab.from_ids(ids) == ItemVocab(ids[:2]).extended(ids[2:])
    assert hash(ItemVocab(ids)) == hash(ItemVocab.from_ids(ids))
    assert ItemVocab(ids) != ItemVocab(ids, ids)  # titles given, even equal to the ids
    assert ItemVocab(ids) != ItemVocab(ids[:3])
    assert ItemVocab(["a", "b"]) != ItemVocab(["b", "a"])
    assert ItemVocab(["a", "b"]).first_difference(ItemVocab(["a", "c", "d"])) == 1
    assert ItemVocab(["x" * 300]).first_difference(ItemVocab(["x" * 299 + "y"])) == 0
    assert ItemVocab(["a", "x" * 300]) != ItemVocab(["a", "y" * 300])  # both kept aside


def test_save_load_round_trip_writes_the_format_json_dumps_did(tmp_path: Path) -> None:
    ids = [i for i in mixed_ids(4, 100) if i != "\ud800"]  # json cannot write a lone surrogate
    titles = [f"T {i} ü" for i in ids]
    for vocab, payload in [
        (ItemVocab(ids, titles), {"ids": ids, "titles": titles}),
        (ItemVocab(ids), {"ids": ids, "titles": None}),
        (ItemVocab([]), {"ids": [], "titles": None}),
    ]:
        vocab.save(tmp_path / "vocab.json")
        written = (tmp_path / "vocab.json").read_text(encoding="utf-8")
        assert written == json.dumps(payload, ensure_ascii=False)
        loaded = ItemVocab.load(tmp_path / "vocab.json")
        assert loaded == vocab and loaded.titles == vocab.titles and loaded.ids == vocab.ids
        assert "".join(vocab.ids_json()) == json.dumps(list(vocab.ids), ensure_ascii=False)


def test_loads_a_vocab_json_written_before(tmp_path: Path) -> None:
    """Files the dict-based vocabulary wrote (``Path.write_text(json.dumps(...))``), and older
    ones without titles."""
    old = tmp_path / "vocab.json"
    payload = {"ids": ["B01", "Café", "3"], "titles": ["One", "Deux", "3"]}
    old.write_text(json.dumps(payload, ensure_ascii=False))
    vocab = ItemVocab.load(old)
    assert vocab.ids == ("B01", "Café", "3") and vocab.titles == ("One", "Deux", "3")
    assert vocab.lookup(["Café", "cafe"]).tolist() == [2, PAD]
    old.write_text(json.dumps({"ids": ["a", "b"]}))
    assert ItemVocab.load(old).titles is None
    old.write_text(json.dumps({"ids": list(range(3))}))
    with pytest.raises(TypeError, match="strings"):
        ItemVocab.load(old)


def test_the_serving_path_builds_no_tuple_of_ids_or_titles(tmp_path: Path) -> None:
    ItemVocab.from_ids(["a", "b", "x" * 300], {"a": "Apple"}).save(tmp_path / "vocab.json")
    vocab = ItemVocab.load(tmp_path / "vocab.json")
    grown = vocab.extended(["c"], {"c": "Cherry"})
    grown.lookup(["a", "zz"]), grown.external([1, 3, 4]), grown.title(4), len(grown), "a" in grown
    grown.save(tmp_path / "grown.json")
    assert grown.first_difference(vocab) is None and grown != vocab
    for v in (vocab, grown):
        assert "ids" not in vars(v) and "titles" not in vars(v)  # the cached tuples


def test_pickled_copies_find_the_same_ids() -> None:
    ids = mixed_ids(5, 300)
    copy = pickle.loads(pickle.dumps(ItemVocab(ids, ids)))
    assert copy.lookup(ids + UNKNOWN).tolist() == reference(ids, ids + UNKNOWN)
    assert copy.titles == tuple(ids)
