"""Item vocabulary: external item ids (strings) <-> dense indices, 0 kept for padding.

Every serving worker holds the vocabulary, so it lives in NumPy arrays rather than as a Python
string, int and dict entry per item: the ids' UTF-8 bytes in a fixed-width bytes array, found
through a cuckoo hash table of int32 slots; titles as one UTF-8 buffer and its offsets. An id the
array cannot hold exactly (longer than its width, or ending in a NUL byte, which NumPy drops) is
kept as a Python string aside; the width is chosen so that these cost less than widening.
``ids`` and ``titles`` become tuples on first use, for the training code that iterates them.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, compress, pairwise
from pathlib import Path

import numpy as np

PAD = 0

_UTF8 = ("utf-8", "surrogatepass")  # JSON may carry lone surrogates: they round-trip
_ASIDE_BYTES = 160  # an id kept aside, besides its characters: str header, dense index, two dict entries
_MAX_LOAD = 0.4  # items per slot: two-choice cuckoo hashing places nearly all of them below 0.5
_ROUNDS = 100  # rounds of cuckoo moves before the items still moving are kept aside
_SEEDS = 4  # hash multipliers tried before accepting a table that keeps many items aside
_CHUNK = 1 << 16  # ids decoded at a time when writing or comparing every id


class ItemVocab:
    """Dense item indices ``1..len(vocab)`` for external ids; index 0 is padding.

    Attributes:
        ids: external ids; ``ids[i]`` has dense index ``i + 1`` (a tuple built on first use).
        titles: optional human-readable titles aligned with ``ids`` (likewise).

    Example:
        >>> vocab = ItemVocab.from_ids(["B01", "B02"])
        >>> vocab.lookup(["B02", "nope"]).tolist(), vocab.external([1])
        ([2, 0], ['B01'])
    """

    _keys: np.ndarray  # S{width} [n + 1]: UTF-8 ids, b"" in row 0 and for the ids kept aside
    _long: dict[int, str]  # dense id -> id, for the ids the array cannot hold exactly
    _table: _Table  # dense ids of the non-empty keys
    _spill: dict[str, int]  # id -> dense id, for the ids the table does not hold
    _titles: _Strings | None

    def __init__(self, ids: Iterable[str], titles: Iterable[str] | None = None) -> None:
        encoded = _encode(ids, "ids")
        if len(set(encoded)) != len(encoded):
            raise ValueError("ItemVocab ids must be unique")
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        self._keys, self._long = _keys([b"", *encoded], _width(lengths))
        self._titles = None if titles is None else _Strings.of(titles, "titles")
        if self._titles is not None and len(self._titles) != len(self):
            raise ValueError(f"{len(self._titles)} titles for {len(self)} items")
        self._table, left = _Table.build(self._keys, np.flatnonzero(self._keys != b""))
        self._spill = {}
        self._keep_aside(np.union1d(np.flatnonzero(self._keys[1:] == b"") + 1, left))

    @classmethod
    def from_ids(cls, ids: Iterable[str], titles: dict[str, str] | None = None) -> ItemVocab:
        """Builds a vocabulary in the given order (duplicates keep their first place)."""
        unique = list(dict.fromkeys(str(i) for i in ids))
        vocab = cls(unique, None if titles is None else [titles.get(i, i) for i in unique])
        del unique  # freed before the heap is trimmed
        _give_back_freed_memory()
        return vocab

    def extended(self, ids: Sequence[str], titles: Mapping[str, str] | None = None) -> ItemVocab:
        """This vocabulary with the unknown ``ids`` appended in order (known dense ids never
        move) and ``titles`` (external id -> title) replacing those of their items. Costs a copy
        of the arrays, not a rebuild of them (but for the hash table, rebuilt bigger when full).

        Raises:
            KeyError: a title for an id in neither this vocabulary nor ``ids``.
        """
        fresh = list(dict.fromkeys(map(str, ids)))
        new = list(compress(fresh, self.lookup(fresh) == PAD))
        vocab = object.__new__(ItemVocab)
        keys, vocab._long = _keys(_encode(new, "ids"), self._keys.itemsize, len(self) + 1)
        vocab._keys = np.concatenate([self._keys, keys])
        vocab._long.update(self._long)
        vocab._table, left = self._table.extended(vocab._keys, np.flatnonzero(keys != b"") + len(self) + 1)
        vocab._spill = dict(self._spill)
        vocab._keep_aside(np.union1d(np.flatnonzero(keys == b"") + len(self) + 1, left))
        vocab._titles = self._titles
        if titles or self._titles is not None:
            old = self._titles
            if old is None:  # the ids stand for their titles
                old = _Strings.of(self.external(np.arange(1, len(self) + 1)), "titles")
            vocab._titles = old + _Strings.of(new, "titles")
            if titles:
                dense = vocab.lookup(list(titles))
                if not dense.all():
                    raise KeyError(next(compress(titles, dense == PAD)))
                vocab._titles = vocab._titles.replaced(
                    dict(zip((dense - 1).tolist(), titles.values(), strict=True))
                )
        return vocab

    def _keep_aside(self, dense: np.ndarray) -> None:
        """Lets lookups find the ids ``dense`` outside the table."""
        self._spill.update(zip(self.external(dense), dense.tolist(), strict=True))

    def __len__(self) -> int:
        return len(self._keys) - 1

    @property
    def num_embeddings(self) -> int:
        """Rows an embedding table needs: every item plus the padding row."""
        return len(self._keys)

    def __contains__(self, item_id: str) -> bool:
        return bool(self.lookup([item_id])[0] != PAD)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ItemVocab):
            return NotImplemented
        return (
            len(self) == len(other) and self.first_difference(other) is None and self._titles == other._titles
        )

    def __hash__(self) -> int:
        return hash(len(self))

    def __repr__(self) -> str:
        return f"ItemVocab({len(self)} items{', titled' if self._titles is not None else ''})"

    @cached_property
    def ids(self) -> tuple[str, ...]:
        """External ids: ``ids[i]`` has dense index ``i + 1``."""
        return tuple(self.external(np.arange(1, len(self) + 1)))

    @cached_property
    def titles(self) -> tuple[str, ...] | None:
        """Titles aligned with ``ids``, or None when the data has none."""
        return None if self._titles is None else tuple(self._titles.decoded(0, len(self)))

    def lookup(self, item_ids: Sequence[str]) -> np.ndarray:
        """External ids -> int64 dense indices ``[n]``; unknown ids map to ``PAD`` (0)."""
        try:
            encoded = list(map(str.encode, item_ids))
        except (TypeError, UnicodeEncodeError):  # not only strings, or lone surrogates
            strings = [isinstance(i, str) for i in item_ids]
            found = np.zeros(len(item_ids), np.int64)
            found[strings] = self._find(
                list(compress(item_ids, strings)), _encode(compress(item_ids, strings), "ids")
            )
            return found
        return self._find(item_ids, encoded)

    def _find(self, item_ids: Sequence[str], encoded: list[bytes]) -> np.ndarray:
        """Dense indices ``[n]`` of ``item_ids`` (strings), given their UTF-8 bytes."""
        query = np.array(encoded, self._table.query_dtype)  # an id cut to this width is too long for a key
        found = self._table.find(self._keys, query)
        if "\0" in "".join(item_ids):  # NumPy drops trailing NUL bytes: compare the lengths too
            found[np.strings.str_len(query) != np.fromiter(map(len, encoded), np.int64, len(encoded))] = PAD
        if self._spill:
            for i in np.flatnonzero(found == PAD).tolist():
                found[i] = self._spill.get(item_ids[i], PAD)
        return found

    def external(self, indices: np.ndarray | Sequence[int]) -> list[str]:
        """Dense indices ``[n]`` (``>= 1``) -> external ids.

        Raises:
            IndexError: an index outside ``1..len(vocab)``.
        """
        dense = np.asarray(indices, np.int64)
        if dense.size and (dense.min() < 1 or dense.max() > len(self)):
            bad = dense[(dense < 1) | (dense > len(self))][0]
            raise IndexError(f"dense index {bad} is not in 1..{len(self)}")
        keys = self._keys[dense]
        try:
            ids = list(map(bytes.decode, keys.tolist()))
        except UnicodeDecodeError:  # lone surrogates
            ids = [key.decode(*_UTF8) for key in keys.tolist()]
        if self._long:
            for i in np.flatnonzero(keys == b"").tolist():
                ids[i] = self._long.get(int(dense[i]), "")
        return ids

    def first_difference(self, other: ItemVocab) -> int | None:
        """Position (dense index - 1) of the first id that differs from ``other``'s over the
        length they share, or None when one vocabulary begins with the other."""
        shared = min(len(self), len(other))
        mine, theirs = self._keys[1 : shared + 1], other._keys[1 : shared + 1]
        # An empty key may stand for an id kept aside, and either side may keep aside other ids.
        suspects = np.flatnonzero((mine != theirs) | (mine == b"")) + 1
        for start in range(0, len(suspects), _CHUNK):
            dense = suspects[start : start + _CHUNK]
            pairs = zip(self.external(dense), other.external(dense), strict=True)
            differs = [a != b for a, b in pairs]
            if any(differs):
                return int(dense[differs.index(True)]) - 1
        return None

    def title(self, index: int) -> str:
        """Title of dense index ``index`` (its external id when titles are unknown)."""
        position = range(len(self))[index - 1]  # indexed as the tuple of titles would be
        if self._titles is None:
            return self.external([position + 1])[0]
        return self._titles.decoded(position, position + 1)[0]

    def ids_json(self) -> Iterator[str]:
        """``json.dumps(list(self.ids), ensure_ascii=False)``, in pieces, without the tuple."""
        n = len(self)
        return _json_list(
            self.external(np.arange(a, min(a + _CHUNK, n + 1))) for a in range(1, n + 1, _CHUNK)
        )

    def save(self, path: Path) -> None:
        """Writes the vocabulary as JSON."""
        n, titles = len(self), self._titles
        pieces: Iterable[str] = ["null"]
        if titles is not None:
            pieces = _json_list(titles.decoded(a, min(a + _CHUNK, n)) for a in range(0, n, _CHUNK))
        with Path(path).open("w", encoding="utf-8") as f:
            for piece in chain(['{"ids": '], self.ids_json(), [', "titles": '], pieces, ["}"]):
                f.write(piece)

    @classmethod
    def load(cls, path: Path) -> ItemVocab:
        """Reads a vocabulary written by :meth:`save`.

        Raises:
            ValueError: not JSON, or ids that are not unique.
            KeyError: no ids.
            TypeError: ids or titles that are not strings.
        """
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        vocab = cls(payload["ids"], payload.get("titles"))
        del payload  # freed before the heap is trimmed
        _give_back_freed_memory()
        return vocab


class _Table:
    """Dense ids in a cuckoo hash table: each key (a NumPy bytes string) sits in one of two
    int32 slots, so a lookup of many keys reads two slots each, all at once.

    A key's two slots are the top bits of two multiply-add hashes of its 8-byte words (random
    odd multipliers, a row per hash); keys are compared in full, so the hashes only place them.
    """

    def __init__(self, size: int, width: int, seed: int) -> None:
        self.slots = np.zeros(size, np.int32)  # [size] dense id, or PAD when empty
        self.multipliers = np.random.default_rng(seed).integers(0, 2**64, (2, width // 8), np.uint64)
        self.multipliers |= np.uint64(1)
        self.shift = np.uint64(65 - size.bit_length())  # size is a power of two
        self.query_dtype = np.dtype(f"S{width}")

    @classmethod
    def build(cls, keys: np.ndarray, items: np.ndarray) -> tuple[_Table, np.ndarray]:
        """A table of ``items`` (dense ids of ``keys``), and the items it could not place."""
        size = 8
        while size * _MAX_LOAD < len(items):
            size *= 2
        for seed in range(_SEEDS):
            table = cls(size, 8 * (keys.itemsize // 8 + 1), seed)  # wider than any key
            left = table.place(keys, items)
            if len(left) <= len(items) // 10_000:
                break
        return table, left

    def extended(self, keys: np.ndarray, items: np.ndarray) -> tuple[_Table, np.ndarray]:
        """A copy with ``items`` placed too (rebuilt bigger past ``_MAX_LOAD``), and the items
        it could not place."""
        if np.count_nonzero(self.slots) + len(items) > _MAX_LOAD * len(self.slots):
            return _Table.build(keys, np.flatnonzero(keys != b""))
        table = object.__new__(_Table)
        table.__dict__.update(self.__dict__, slots=self.slots.copy())
        return table, table.place(keys, items)

    def choices(self, keys: np.ndarray) -> np.ndarray:
        """The two slots ``[2, n]`` of each key."""
        words = (
            keys.astype(self.query_dtype, copy=False)
            .view(np.uint64)
            .reshape(len(keys), self.multipliers.shape[1])
        )
        slots = self.multipliers @ words.T
        slots >>= self.shift
        return slots

    def place(self, keys: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Puts ``items`` (dense ids of ``keys``) in the table, moving the items in their way to
        their other slot, in rounds over all moving items at once; returns the items still
        moving after ``_ROUNDS`` rounds."""
        choices = self.choices(keys[items])
        other = np.zeros(len(items), np.intp)  # which of its two slots each item tries
        for _ in range(_ROUNDS):
            if not len(items):
                break
            slots, winner = np.unique(choices[other, np.arange(len(items))], return_index=True)
            evicted = self.slots[slots]
            self.slots[slots] = items[winner]
            lost = np.ones(len(items), bool)
            lost[winner] = False
            moved = evicted != PAD
            evicted_choices = self.choices(keys[evicted[moved]])
            items = np.concatenate([items[lost], evicted[moved]])
            choices = np.concatenate([choices[:, lost], evicted_choices], axis=1)
            other = np.concatenate([1 - other[lost], evicted_choices[0] == slots[moved]]).astype(np.intp)
        return items

    def find(self, keys: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Dense ids (int64 ``[n]``, PAD when absent) of ``query`` (bytes strings of ``query_dtype``)."""
        candidates = self.slots[self.choices(query)]  # [2, n]
        found = np.multiply(candidates, keys[candidates] == query, dtype=np.int64)
        return found[0] | found[1]  # PAD where a slot holds another key; the same id when both hold it


@dataclass(frozen=True, eq=False)
class _Strings:
    """Strings as their UTF-8 bytes end to end: string ``i`` is ``data[offsets[i]:offsets[i + 1]]``."""

    data: bytes
    offsets: np.ndarray  # int64 [n + 1]

    @classmethod
    def of(cls, strings: Iterable[str], what: str) -> _Strings:
        encoded = _encode(strings, what)
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Strings)
            and self.data == other.data
            and np.array_equal(self.offsets, other.offsets)
        )

    def __add__(self, other: _Strings) -> _Strings:
        return _Strings(
            self.data + other.data, np.concatenate([self.offsets, other.offsets[1:] + self.offsets[-1]])
        )

    def decoded(self, start: int, stop: int) -> list[str]:
        """Strings ``start..stop - 1``."""
        bounds = self.offsets[start : stop + 1].tolist()
        return [self.data[a:b].decode(*_UTF8) for a, b in pairwise(bounds)]

    def replaced(self, values: Mapping[int, str]) -> _Strings:
        """These strings with ``values`` (position -> string) in place of theirs."""
        lengths, pieces, end = np.diff(self.offsets), [], 0
        for i in sorted(values):
            (value,) = _encode([values[i]], "titles")
            pieces += [self.data[end : self.offsets[i]], value]
            lengths[i], end = len(value), self.offsets[i + 1]
        offsets = np.zeros_like(self.offsets)
        np.cumsum(lengths, out=offsets[1:])
        return _Strings(b"".join([*pieces, self.data[end:]]), offsets)


def _encode(strings: Iterable[str], what: str) -> list[bytes]:
    """UTF-8 bytes of each string.

    Raises:
        TypeError: an item that is not a string.
    """
    try:
        return [str.encode(s, *_UTF8) for s in strings]
    except TypeError as e:
        raise TypeError(f"item {what} must be strings") from e


def _width(lengths: np.ndarray) -> int:
    """The key width (bytes) that holds ids of these UTF-8 ``lengths`` in least memory:
    ``width`` bytes each in the array, and each longer id kept aside as a Python string."""
    ordered = np.sort(lengths)
    widths = np.unique(np.maximum(ordered, 1))
    if not len(widths):
        return 1
    first_longer = np.searchsorted(ordered, widths, "right")
    tail = np.append(np.cumsum(ordered[::-1])[::-1], 0)  # tail[i]: bytes of ordered[i:]
    aside = (len(ordered) - first_longer) * _ASIDE_BYTES + tail[first_longer]
    return int(widths[np.argmin(len(ordered) * widths + aside)])


def _keys(encoded: list[bytes], width: int, first: int = 0) -> tuple[np.ndarray, dict[int, str]]:
    """``encoded`` as a bytes array of ``width``, with an empty key for each id it cannot hold
    exactly, and those ids by dense index (the first one's being ``first``)."""
    keys = np.array(encoded, f"S{width}")  # longer ones cut
    inexact = np.flatnonzero(
        np.strings.str_len(keys) != np.fromiter(map(len, encoded), np.int64, len(encoded))
    )
    keys[inexact] = b""
    return keys, {first + i: encoded[i].decode(*_UTF8) for i in inexact.tolist()}


def _give_back_freed_memory() -> None:
    """Returns the C heap's free pages to the system: glibc keeps what building a large
    vocabulary freed, several times the vocabulary's size (a no-op without ``malloc_trim``)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _json_list(chunks: Iterable[list[str]]) -> Iterator[str]:
    """``json.dumps(list(chain(*chunks)), ensure_ascii=False)``, a piece per chunk."""
    yield "["
    for n, chunk in enumerate(chunks):
        yield (", " if n else "") + json.dumps(chunk, ensure_ascii=False)[1:-1]
    yield "]"
