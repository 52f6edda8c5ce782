"""Memory a FAISS index will take, from its factory string and catalogue size, before building it.

The numbers follow FAISS's data layout: per-vector codes (``d * 4`` bytes for Flat, ``m * nbits / 8``
for PQ, ``d`` for SQ8), inverted-list ids (8 bytes per vector for IVF), HNSW neighbour lists
(``2M`` int32 on level 0 plus about one level above per ``M`` nodes), fixed trained tables
(coarse centroids, PQ codebooks, OPQ/PCA matrices) and the ``IDMap2`` id table (8 bytes per
vector on disk; in memory also a hash map from id to row, roughly 40 bytes per vector).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_IDMAP2_MEMORY_PER_VECTOR = 8 + 40  # id_map entry + unordered_map node and bucket


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated size of an index.

    Attributes:
        disk_bytes: size of the file ``FaissIndex.save`` writes.
        memory_bytes: resident size once loaded (the file's structures plus the id hash map).
        per_vector_bytes: memory per indexed vector, fixed tables excluded.
        fixed_bytes: trained tables whose size does not grow with the catalogue.
    """

    disk_bytes: int
    memory_bytes: int
    per_vector_bytes: float
    fixed_bytes: int

    def __str__(self) -> str:
        return (
            f"~{_human(self.memory_bytes)} in memory, ~{_human(self.disk_bytes)} on disk "
            f"({self.per_vector_bytes:.1f} B/vector + {_human(self.fixed_bytes)} fixed)"
        )


def estimate_memory(factory: str, n: int, d: int) -> MemoryEstimate:
    """Estimates the size of ``factory`` holding ``n`` vectors of dimension ``d``.

    Args:
        factory: FAISS factory string (``IDMap2,`` prefix optional), e.g. ``"IVF4096,PQ32"``,
            or FaissIndex's ``"L2MIPS,..."``.
        n: catalogue size.
        d: vector dimension.

    Raises:
        ValueError: a component of the factory string this estimator does not know.

    Example:
        >>> str(estimate_memory("Flat", 1_000_000, 64))
        '~289.9 MiB in memory, ~251.8 MiB on disk (304.0 B/vector + 0 B fixed)'
    """
    factory = factory.removeprefix("IDMap2,")
    if factory.startswith("L2MIPS,"):  # FaissIndex's MIPS-to-L2 reduction: one more dimension
        factory, d = factory.removeprefix("L2MIPS,"), d + 1
    parts = [p.strip() for p in factory.split(",") if p.strip()]
    sizes = _Sizes(dim=d)
    i = _pre_transforms(parts, sizes)
    i, storage = _coarse_structure(parts, i, sizes)
    if storage is None:
        if i >= len(parts):
            raise ValueError(f"cannot estimate the memory of {factory!r}: no storage component")
        storage = parts[i]
        i += 1
    codes, codebook = _codes(storage, sizes.dim, factory)
    sizes.per_vector += codes
    sizes.fixed += codebook
    for extra in parts[i:]:
        if extra == "RFlat":
            sizes.per_vector += 4 * d
        else:
            raise ValueError(f"cannot estimate the memory of {factory!r}: unknown component {extra!r}")
    disk = sizes.per_vector * n + sizes.fixed + 8 * n
    memory = sizes.per_vector * n + sizes.fixed + _IDMAP2_MEMORY_PER_VECTOR * n
    return MemoryEstimate(
        int(disk), int(memory), sizes.per_vector + _IDMAP2_MEMORY_PER_VECTOR, int(sizes.fixed)
    )


@dataclass
class _Sizes:
    """What a factory string's components add up to as they are read: bytes per vector of the
    FAISS structures (on disk and in memory), fixed bytes, and the dimension the next one sees."""

    dim: int
    per_vector: float = 0.0
    fixed: float = 0.0


def _pre_transforms(parts: list[str], sizes: _Sizes) -> int:
    """Adds the leading pre-transforms (OPQ, PCA, RR), which change the dimension the rest of
    the index sees; returns the index of the first other part."""
    i = 0
    while i < len(parts) and (m := re.fullmatch(r"(OPQ|PCAR?|PCAW|RR)(\d+)(?:_(\d+))?", parts[i])):
        kind, a, b = m.group(1), int(m.group(2)), m.group(3)
        out = int(b) if kind == "OPQ" and b else (sizes.dim if kind == "OPQ" else a)
        sizes.fixed += 4 * (sizes.dim * out + sizes.dim)
        sizes.dim = out
        i += 1
    return i


def _coarse_structure(parts: list[str], i: int, sizes: _Sizes) -> tuple[int, str | None]:
    """Adds an IVF or HNSW component at ``parts[i]``, if there is one; returns the index of the
    next part and the storage HNSW names (``None``: the next part is the storage)."""
    if i < len(parts) and (m := re.fullmatch(r"IVF(\d+)(?:_HNSW(\d+))?", parts[i])):
        nlist = int(m.group(1))
        sizes.fixed += 4 * nlist * sizes.dim + 24 * nlist  # centroids, one (codes, ids) vector pair per list
        if m.group(2):
            sizes.fixed += nlist * _hnsw_links(int(m.group(2)))
        sizes.per_vector += 8  # the id stored beside each code
        return i + 1, None
    if i < len(parts) and (m := re.fullmatch(r"HNSW(\d+)(?:_(\w+))?", parts[i])):
        sizes.per_vector += _hnsw_links(int(m.group(1)))
        i += 1
        storage = m.group(2) or "Flat"  # "HNSW32_PQ16" names its storage after the underscore
        if not m.group(2) and i < len(parts) and parts[i] != "RFlat":
            storage = parts[i]
            i += 1
        return i, storage
    return i, None


def _hnsw_links(m: int) -> float:
    """Bytes per node of an HNSW graph: 2M level-0 neighbours, ~M/(M-1) above (a node reaches
    level l with probability M^-l), the level and the neighbour-list offset."""
    return 4 * (2 * m + m / (m - 1)) + 4 + 8


def _codes(part: str, dim: int, factory: str) -> tuple[float, float]:
    """(bytes per vector, fixed bytes) of a storage component."""
    if part == "Flat":
        return 4.0 * dim, 0.0
    if m := re.fullmatch(r"PQ(\d+)(?:x(\d+))?(fs|fsr)?(np)?", part):
        sub, nbits = int(m.group(1)), int(m.group(2) or (4 if m.group(3) else 8))
        return sub * nbits / 8, 4.0 * (2**nbits) * dim
    if m := re.fullmatch(r"SQ(4|6|8|fp16|bf16)", part):
        bits = {"4": 4, "6": 6, "8": 8, "fp16": 16, "bf16": 16}[m.group(1)]
        return dim * bits / 8, 8.0 * dim
    raise ValueError(f"cannot estimate the memory of {factory!r}: unknown component {part!r}")


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")
