"""Hot reload: the retriever in service is swapped for a new model+index version without downtime.

A :class:`DeploymentWatcher` polls a deployment root (:mod:`retrieval.artifacts.deployment`); when its
``current`` version changes it loads the new model and index in the background (the index must
have been built from that model), warms them up, and swaps them into the :class:`RetrieverSlot`
the server reads. A batch already computing finishes on the old version; the next one uses the
new. A version that fails to load or to answer the warm-up is refused and logged, and the old
one keeps serving. Both versions are in memory for the moment of the swap.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from retrieval.api.types import Query, Rerank
from retrieval.artifacts.deployment import deployment_dirs, deployment_rankers
from retrieval.serving.retriever import Retriever
from retrieval.storage.versions import resolve_current

logger = logging.getLogger(__name__)

SwapHook = Callable[[Retriever, Retriever], None]
"""Called with ``(old, new)`` after each swap."""


class RetrieverSlot:
    """Holds the retriever in service; readers take :attr:`current` once per batch."""

    def __init__(self, retriever: Retriever) -> None:
        self._current = retriever
        self._lock = threading.Lock()
        self._hooks: list[SwapHook] = []

    @property
    def current(self) -> Retriever:
        return self._current

    def on_swap(self, hook: SwapHook) -> None:
        """Registers ``hook(old, new)``, called after every swap (e.g. to update metrics)."""
        self._hooks.append(hook)

    def swap(self, new: Retriever) -> Retriever:
        """Puts ``new`` in service (it inherits the old one's search hook); returns the old one."""
        with self._lock:
            old = self._current
            new.observe_search = old.observe_search
            self._current = new
        for hook in self._hooks:
            hook(old, new)
        return old


def warm_up(retriever: Retriever, batch_sizes: tuple[int, ...] = (1, 8, 32)) -> None:
    """Answers a few batches so the first real ones do not pay for lazy initialisation: by
    default one per batch size the user tower and the rankers are compiled for, up to the
    default micro-batch (``retrieval.artifacts.xla.COMPILED_BATCHES``), and per ranker the same batches
    reranking the default number of candidates.

    Raises:
        Exception: whatever the retriever raises; a version that cannot answer is not served.
    """
    vocab = retriever.model.vocab
    history = list(vocab.ids[-retriever.model.max_len :])
    k = min(10, len(vocab))
    for size in batch_sizes:
        retriever.retrieve_many([Query(history, k)] * size)
        for name in retriever.rankers:
            retriever.retrieve_many([Query(history, k, rerank=Rerank(name))] * size)


def load_deployment(root: Path, xla: bool = False) -> Retriever:
    """A retriever for the current version of the deployment ``root`` (or for one version
    folder), warmed up.

    Raises:
        retrieval.storage.manifest.ArtifactError: a missing, corrupted or mismatched artifact.
    """
    retriever = Retriever.from_dirs(*deployment_dirs(root), deployment_rankers(root), xla=xla)
    warm_up(retriever)
    return retriever


class DeploymentWatcher:
    """Swaps each new version of a deployment root into a slot (see the module docstring).

    Example:
        >>> slot = RetrieverSlot(load_deployment(root))
        >>> server, port = create_server(slot)
        >>> watcher = DeploymentWatcher(root, slot)
        >>> watcher.start()  # polls every 2 s until watcher.stop()
    """

    def __init__(self, root: Path, slot: RetrieverSlot, interval: float = 2.0) -> None:
        """Watches ``root``, whose current version is taken to be the one ``slot`` serves."""
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.root = Path(root)
        self.slot = slot
        self.interval = interval
        self.refused = 0
        """Versions that failed to load or warm up."""
        self._seen = resolve_current(self.root)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """Loads and swaps in the current version if it is new; ``True`` when it swapped.

        A version is tried once: a broken one is not reloaded on every poll, only the next
        published version is.
        """
        folder = resolve_current(self.root)
        if folder == self._seen:
            return False
        self._seen = folder
        try:
            retriever = load_deployment(folder)  # the version folder itself: it cannot move
        except Exception:  # any failure refuses the version; the old one keeps serving
            self.refused += 1
            logger.exception("refused %s; still serving model %s", folder, self.slot.current.model_version)
            return False
        old = self.slot.swap(retriever)
        logger.info(
            "now serving model %s from %s (was %s)", retriever.model_version, folder, old.model_version
        )
        # The old version's TensorFlow objects sit in reference cycles that only a full collection
        # frees, and a busy server seldom runs one: each reload would keep the old model's memory.
        del old, retriever
        gc.collect()
        return True

    def start(self) -> None:
        """Polls every ``interval`` seconds in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="deployment-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops polling (a load in progress finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()
