"""Hot reload: the retriever in service is swapped for a new model+index version without downtime.

A :class:`DeploymentWatcher` polls a deployment root (:mod:`retrieval.artifacts.deployment`); when its
``current`` version is not the one in service it loads it in the background
(:func:`load_deployment`: the index must have been built from that model, the vectors must be
finite, the version must warm up and answer), and swaps it into the :class:`RetrieverSlot` the
server reads. A batch already computing finishes on the old version; the next one uses the new.
A version that fails is refused once, logged as an error and counted on the slot (``GetModelInfo``,
``retrieval_reload_refusals_total``), and the old one keeps serving. Both versions are in memory
for the moment of the swap. A server starting on a root whose current version fails serves the
newest version on disk that loads (:func:`open_deployment`).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from index import FaissIndex
from retrieval.api.types import ModelInfo, Query, Rerank
from retrieval.artifacts.deployment import deployment_dirs, deployment_rankers
from retrieval.serving.retriever import Retriever
from retrieval.storage.manifest import ArtifactError
from retrieval.storage.versions import resolve_current, version_folders

logger = logging.getLogger(__name__)

SwapHook = Callable[[Retriever, Retriever], None]
"""Called with ``(old, new)`` after each swap."""

RefusalHook = Callable[[Path, str], None]
"""Called with ``(version folder, reason)`` after each refusal."""

REFUSAL_CHARS = 300
"""Longest reason kept for a refused version (TensorFlow's errors run to pages)."""

_CHECK_ROWS = 65536
"""Index vectors decoded at a time by the finiteness check."""

_CHECK_USERS, _CHECK_K = 8, 100
"""One-item histories whose interests the check scores against the index, and items per interest."""


def describe_error(error: BaseException, limit: int = REFUSAL_CHARS) -> str:
    """``error`` on one line (whitespace collapsed), at most ``limit`` characters: an
    :class:`ArtifactError`'s message, which says what is wrong, or ``Type: message``."""
    text = str(error) if isinstance(error, ArtifactError) else f"{type(error).__name__}: {error}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RetrieverSlot:
    """Holds the retriever in service; readers take :attr:`current` once per batch. Also counts
    the versions refused instead of it (:meth:`refuse`)."""

    def __init__(self, retriever: Retriever) -> None:
        self._current = retriever
        self._lock = threading.Lock()
        self._hooks: list[SwapHook] = []
        self._refusal_hooks: list[RefusalHook] = []
        self._refused: set[Path] = set()
        self.refusals = 0
        """Versions refused: at start (:func:`open_deployment`) or by a watcher."""
        self.last_refusal = ""
        """Why the latest version was refused, at most :data:`REFUSAL_CHARS` characters."""

    @property
    def current(self) -> Retriever:
        return self._current

    @property
    def folder(self) -> Path | None:
        """The deployment version folder in service: the one its model was loaded from
        (``None`` for a model built in memory)."""
        path = self._current.model.path
        return None if path is None else path.resolve().parent

    def on_swap(self, hook: SwapHook) -> None:
        """Registers ``hook(old, new)``, called after every swap (e.g. to update metrics)."""
        self._hooks.append(hook)

    def on_refuse(self, hook: RefusalHook) -> None:
        """Registers ``hook(folder, reason)``, called after every refusal (e.g. to count it)."""
        self._refusal_hooks.append(hook)

    def swap(self, new: Retriever) -> Retriever:
        """Puts ``new`` in service (it inherits the old one's search hook); returns the old one."""
        with self._lock:
            old = self._current
            new.observe_search = old.observe_search
            self._current = new
        for hook in self._hooks:
            hook(old, new)
        return old

    def refuse(self, folder: Path, error: BaseException) -> None:
        """Records that the version ``folder`` was refused because of ``error``."""
        reason = describe_error(error)
        with self._lock:
            self._refused.add(folder.resolve())
            self.refusals += 1
            self.last_refusal = reason
        for hook in self._refusal_hooks:
            hook(folder, reason)

    def was_refused(self, folder: Path) -> bool:
        """Whether the version ``folder`` was refused already (it is not tried again)."""
        return folder.resolve() in self._refused

    def model_info(self) -> ModelInfo:
        """The retriever's :meth:`~Retriever.model_info` with this slot's refusals."""
        return dataclasses.replace(
            self._current.model_info(), reload_refusals=self.refusals, last_refusal=self.last_refusal
        )


WARM_UP_BATCHES = (1, 8, 32)
"""Batch sizes a served version is warmed up for (see :func:`warm_up`)."""


def warm_up(retriever: Retriever, batch_sizes: tuple[int, ...] = WARM_UP_BATCHES) -> None:
    """Answers a few batches so the first real ones do not pay for lazy initialisation: by
    default one per batch size the user tower and the rankers are compiled for, up to the
    default micro-batch (``retrieval.artifacts.xla.COMPILED_BATCHES``), and per ranker the same batches
    reranking the default number of candidates.

    Raises:
        Exception: whatever the retriever raises; a version that cannot answer is not served.
    """
    vocab = retriever.model.vocab
    known = range(1, min(retriever.model.tower_items, len(vocab)) + 1)  # the ids the tower reads
    history = vocab.external(known[-retriever.model.max_len :])
    k = min(10, len(vocab))
    for size in batch_sizes:
        retriever.retrieve_many([Query(history, k)] * size)
        for name in retriever.rankers:
            retriever.retrieve_many([Query(history, k, rerank=Rerank(name))] * size)


def check_answers(retriever: Retriever) -> None:
    """Checks what loading does not: every vector of a FAISS index is finite (a Milvus index
    keeps its vectors in its own store), real interests score finitely and differently
    (:func:`_check_interests`), and a one-item history retrieves items (NaN scores, for one, are
    dropped from answers).

    Raises:
        ArtifactError: NaN or infinite index vectors, useless scores, or an empty answer.
    """
    index = retriever.index
    if isinstance(index, FaissIndex) and not _finite_vectors(index):
        raise ArtifactError(f"index {index.factory!r} holds NaN or infinite vectors")
    _check_interests(retriever)
    vocab = retriever.model.vocab
    if len(vocab) > 1 and not retriever.retrieve(vocab.external([1]), k=min(10, len(vocab) - 1)).items:
        raise ArtifactError("a one-item history retrieves nothing (NaN scores?)")


def _check_interests(retriever: Retriever) -> None:
    """Scores the interests of :data:`_CHECK_USERS` users against the index, each with a history
    of one item the tower knows (spread over its items): every score must be finite (finite
    vectors can still overflow: 3e38 in every component scores +inf) and the users must not all
    get the same items in the same order (scores that do not depend on the user). One call of
    the tower, one search.

    Raises:
        ArtifactError: a score that is not finite, or the same answer for every user.
    """
    known = min(retriever.model.tower_items, len(retriever.model.vocab))
    if known < 1:
        return
    items = np.unique(np.linspace(1, known, min(_CHECK_USERS, known)).round().astype(np.int64))
    interests = retriever.model.encode([np.array([i]) for i in items])  # [U, K, d]
    users, dim = len(items), interests.shape[-1]
    scores, ids = retriever.index.search(interests.reshape(-1, dim), _CHECK_K)  # [U·K, k]
    found = scores[ids >= 0]
    if not np.isfinite(found).all():
        raise ArtifactError(
            f"{int((~np.isfinite(found)).sum())} of the {found.size} scores of {users} sampled users' "
            "interests are not finite (item vectors too large?)"
        )
    answers = ids.reshape(users, -1)
    if users > 1 and (answers == answers[0]).all():
        raise ArtifactError(
            f"the {users} sampled users all get the same items in the same order ({int((ids[0] >= 0).sum())} "
            "per interest): the scores do not depend on the user"
        )


def _finite_vectors(index: FaissIndex) -> bool:
    """Whether every stored vector is finite (decoded :data:`_CHECK_ROWS` at a time); ``True``
    for an index type that cannot decode them (the answer check still runs)."""
    inner = index.faiss_index.index
    try:
        for start in range(0, inner.ntotal, _CHECK_ROWS):
            if not np.isfinite(inner.reconstruct_n(start, min(_CHECK_ROWS, inner.ntotal - start))).all():
                return False
    except RuntimeError as e:  # FAISS: "reconstruct not implemented" for this index type
        logger.info("index vectors not checked: %s", describe_error(e))
    return True


def load_deployment(
    root: Path,
    xla: bool = False,
    batch_sizes: tuple[int, ...] = WARM_UP_BATCHES,
    reuse: Retriever | None = None,
) -> Retriever:
    """A retriever for the current version of the deployment ``root`` (or for one version
    folder), warmed up for ``batch_sizes`` (:func:`warm_up`) and checked (:func:`check_answers`).
    The version is resolved once: the model, the index and the rankers all come from it
    (:attr:`RetrieverSlot.folder`). A version sharing its user tower with ``reuse`` (the one in
    service; ``mitt add-items`` publishes such versions) takes that tower instead of loading it.

    Raises:
        retrieval.storage.manifest.ArtifactError: a missing, corrupted or mismatched artifact, or
            a version that fails to warm up or to answer; the message names the version.
    """
    folder = resolve_current(Path(root))
    try:
        model_dir, index_dir = deployment_dirs(folder)
        retriever = Retriever.from_dirs(
            model_dir,
            index_dir,
            deployment_rankers(folder),
            xla=xla,
            reuse=reuse,
        )
        warm_up(retriever, batch_sizes)
        check_answers(retriever)
    except Exception as e:  # whatever fails, the version cannot serve
        raise ArtifactError(f"version {folder.name}: {describe_error(e, limit=2000)}") from e
    return retriever


def open_deployment(root: Path, current: Path | None = None) -> RetrieverSlot:
    """A slot serving the current version of the deployment ``root`` (:func:`load_deployment`),
    or its version folder ``current`` (a serving group's workers all load the one its
    supervisor resolved).

    If that version fails, the newest other version on disk that loads is served instead: an
    error is logged naming both, and the refusal is counted on the slot (a watcher does not try
    that version again). One bad publication cannot stop a restart while good ones are on disk.

    Raises:
        retrieval.storage.manifest.ArtifactError: no version loads (the current one's error).
    """
    current = resolve_current(Path(root)) if current is None else current.resolve()
    try:
        return RetrieverSlot(load_deployment(current))
    except ArtifactError as e:
        refused = e
    for folder in reversed(version_folders(root)):
        if folder.resolve() == current:
            continue
        try:
            retriever = load_deployment(folder)
        except ArtifactError as e:
            logger.warning("version %s does not load either: %s", folder.name, describe_error(e))
            continue
        logger.error(
            "refused the current %s; serving version %s (model %s), the newest one on disk that loads",
            describe_error(refused, limit=2000),
            folder.name,
            retriever.model_version,
        )
        slot = RetrieverSlot(retriever)
        slot.refuse(current, refused)
        return slot
    raise refused


def swap_version(slot: RetrieverSlot, folder: Path, retriever: Retriever) -> None:
    """Puts ``retriever`` (loaded from the version ``folder``) in service in ``slot``, logs it,
    and frees the old version."""
    old = slot.swap(retriever)
    logger.info("now serving model %s from %s (was %s)", retriever.model_version, folder, old.model_version)
    # The old version's TensorFlow objects sit in reference cycles that only a full collection
    # frees, and a busy server seldom runs one: each reload would keep the old model's memory.
    del old, retriever
    gc.collect()


def refuse_version(slot: RetrieverSlot, folder: Path, error: BaseException) -> None:
    """Records on ``slot`` that the version ``folder`` was refused because of ``error`` and logs
    it as an error; the version in service keeps serving."""
    slot.refuse(folder, error)
    logger.error(
        "refused the new %s; still serving model %s",
        describe_error(error, limit=2000),
        slot.current.model_version,
    )


class DeploymentWatcher:
    """Swaps each new version of a deployment root into a slot (see the module docstring).

    Example:
        >>> slot = open_deployment(root)
        >>> server, port = create_server(slot)
        >>> watcher = DeploymentWatcher(root, slot)
        >>> watcher.start()  # polls every 2 s until watcher.stop()
    """

    def __init__(self, root: Path, slot: RetrieverSlot, interval: float = 2.0) -> None:
        """Watches ``root`` for versions other than the one ``slot`` serves (:attr:`RetrieverSlot.folder`),
        so one published while the server started is loaded at the first poll."""
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.root = Path(root)
        self.slot = slot
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def refused(self) -> int:
        """Versions refused (:attr:`RetrieverSlot.refusals`)."""
        return self.slot.refusals

    def check(self) -> bool:
        """Loads and swaps in the current version if it is not in service; ``True`` when it swapped.

        A version is tried once: a refused one is not reloaded on every poll, only the next
        published version is.
        """
        folder = resolve_current(self.root).resolve()
        if folder == self.slot.folder or self.slot.was_refused(folder):
            return False
        try:
            # The version folder itself (it cannot move); its tower may be the one in service.
            retriever = load_deployment(folder, reuse=self.slot.current)
        except ArtifactError as e:  # the old version keeps serving
            refuse_version(self.slot, folder, e)
            return False
        swap_version(self.slot, folder, retriever)
        return True

    def start(self) -> None:
        """Polls every ``interval`` seconds in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="deployment-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stops polling; waits up to ``timeout`` seconds (``None``: as long as it takes) for a
        load in progress, which a stopping server need not wait for (the thread is a daemon).
        Returns whether the watcher has stopped."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()
