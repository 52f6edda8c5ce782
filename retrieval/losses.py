"""The training task: how interests meet a target, where negatives come from, and the loss.

Towers only compute embeddings; everything about the loss lives here. A
:class:`RetrievalTask` is assembled from two strategies:

* **negatives** (:class:`Negatives`): the catalogue (:class:`AllItems`), items drawn by a
  :class:`CandidateSampler` (:class:`SampledNegatives`), or the batch's other targets
  (:class:`InBatchNegatives`), alone or mixed;
* **loss on the logits** (:class:`SoftmaxCrossEntropy`, :class:`GeneralisedBCE`).

Every candidate logit is ``<q, e_j> / T``; softmax losses subtract ``log E[count of j]`` (the
log-Q correction, summed over the sources that propose j), and accidental hits (a candidate
equal to the row's own target) are removed. :data:`LOSSES` names the combinations and
:func:`build_task` builds one by name.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

SAMPLERS = ("popularity", "uniform", "log_uniform")
INTEREST_SELECTIONS = ("hard", "label_aware", "max")
LOSSES = ("sampled_softmax", "full_softmax", "in_batch", "mixed", "bce", "gbce")
"""Names accepted by :func:`build_task` (``train.loss``)."""


def _active_scores(interests: Any, target: Any) -> tuple[Any, Any]:
    """``<v_k, e_t>`` ``[B, K]`` and which interests are real (not all-zero, i.e. not masked) ``[B, K]``."""
    scores = tf.einsum("bkd,bd->bk", interests, target)
    active = tf.reduce_any(tf.not_equal(interests, 0.0), axis=-1)
    return scores, active


def select_interest(interests: Any, target: Any) -> Any:
    """ComiRec's hard selection: the interest that scores highest against the target.

    All-zero interests (masked by towers with a per-user number of interests) are never
    selected unless the user has no other.

    Args:
        interests: ``[B, K, d]``.
        target: target item embeddings ``[B, d]``.

    Returns:
        ``[B, d]``: ``interests[b, argmax_k <interests[b, k], target[b]>]``. Gradients flow
        only into the selected interest.
    """
    scores, active = _active_scores(interests, target)  # [B, K]
    scores = tf.where(active, scores, scores.dtype.min)
    best = tf.argmax(scores, axis=1, output_type=tf.int32)  # [B]
    return tf.gather(interests, best, axis=1, batch_dims=1)


def label_aware_attention(interests: Any, target: Any, power: float = 1.0) -> Any:
    """MIND's label-aware attention: ``Σ_k softmax_k(pow(<v_k, e_t>, p)) v_k``.

    ``p = 0`` weighs every interest equally (the mean), ``p = 1`` is a softmax of the
    inner products, and a larger ``p`` moves towards the hard selection of
    :func:`select_interest`. ``pow`` is taken sign-preserving, ``sign(x)·|x|^p``: equal to the
    paper's ``x^p`` for ``x >= 0`` and, unlike it, defined and increasing in ``x`` for negative
    inner products and any real ``p`` (the paper's interests are ReLU outputs; ours need not be).
    All-zero (masked) interests get zero weight. Keep ``|x|^p`` finite in float32: ``p`` of a
    few units for inner products of order 1-10.

    Args:
        interests: ``[B, K, d]``.
        target: target item embeddings ``[B, d]``.
        power: ``p >= 0``.

    Returns:
        ``[B, d]``; gradients flow into every interest and through the attention weights.
    """
    if power < 0:
        raise ValueError(f"label-aware attention power must be >= 0, got {power}")
    scores, active = _active_scores(interests, target)  # [B, K]
    if power == 0:
        logits = tf.zeros_like(scores)
    else:
        # |x| floored so that the gradient of |x|^p stays finite at x = 0 for p < 1.
        logits = tf.sign(scores) * tf.pow(tf.maximum(tf.abs(scores), 1e-12), power)
    weights = tf.nn.softmax(tf.where(active, logits, logits.dtype.min), axis=1)  # [B, K]
    return tf.einsum("bk,bkd->bd", weights, interests)


def interest_scores(query: Any, vectors: Any, per_row: bool) -> Any:
    """Scores of item vectors under each row's query: ``<q, e>`` for ``[M, d]`` queries, and for
    ``[M, K, d]`` ones ``max_k <q_k, e>`` (all-zero, i.e. masked, interests skipped), the score
    the multi-interest search ranks items by (:func:`retrieval.search.search_interests`).

    Args:
        query: ``[M, d]`` or ``[M, K, d]``.
        vectors: with ``per_row``, ``[M, d]`` (an item per row) or ``[M, N, d]`` (``N`` per
            row); without, ``[N, d]`` shared by every row.

    Returns:
        ``[M]`` for an item per row, else ``[M, N]``.
    """
    one = per_row and vectors.shape.rank == 2
    if query.shape.rank == 2:
        if one:
            return tf.reduce_sum(query * vectors, axis=-1)
        if per_row:
            return tf.einsum("md,mnd->mn", query, vectors)
        return tf.matmul(query, vectors, transpose_b=True)
    if one:
        scores = tf.einsum("mkd,md->mk", query, vectors)[:, :, None]  # [M, K, 1]
    else:
        scores = tf.einsum("mkd,mnd->mkn" if per_row else "mkd,nd->mkn", query, vectors)  # [M, K, N]
    active = tf.reduce_any(tf.not_equal(query, 0.0), axis=-1)  # [M, K]
    best = tf.reduce_max(tf.where(active[:, :, None], scores, scores.dtype.min), axis=1)  # [M, N]
    return best[:, 0] if one else best


# --------------------------------------------------------------------------- logits and losses


def candidate_logits(
    query: Any,
    positive: Any,
    positive_ids: Any,
    candidates: Any,
    candidate_ids: Any,
    positive_log_q: Any = 0.0,
    candidate_log_q: Any = 0.0,
    temperature: float = 1.0,
    remove_accidental_hits: bool = True,
) -> tuple[Any, Any, Any]:
    """Corrected logits of each row's positive and of its candidate negatives.

    Candidates are either shared by every row (``candidates [N, d]``, ids and log-Q ``[N]``) or
    drawn per row (``candidates [M, N, d]``, ids and log-Q ``[M, N]``).

    Args:
        query: ``[M, d]``, or ``[M, K, d]`` K interests scored by their best (:func:`interest_scores`).
        positive: ``[M, d]``; positive_ids: ``[M]``.
        candidates: ``[N, d]`` or ``[M, N, d]``; candidate_ids: ``[N]`` or ``[M, N]``.
        positive_log_q: ``[M]`` (or 0): subtracted from the positive logit.
        candidate_log_q: like ``candidate_ids`` (or 0): subtracted from the candidate logits.
        temperature: logits ``<q, e> / T``.
        remove_accidental_hits: mark candidates equal to the row's positive as invalid.

    Returns:
        ``pos_logit [M]``, ``neg_logits [M, N]`` and ``valid`` bool ``[M, N]`` (False = an
        accidental hit, to be left out of the loss).
    """
    pos_logit = interest_scores(query, positive, per_row=True) / temperature - positive_log_q  # [M]
    shared = candidate_ids.shape.rank == 1  # or one set per row
    neg_logits = interest_scores(query, candidates, per_row=not shared)  # [M, N]
    ids = candidate_ids[None, :] if shared else candidate_ids  # [1, N] or [M, N]
    neg_logits = neg_logits / temperature - candidate_log_q
    if remove_accidental_hits:
        valid = tf.not_equal(ids, tf.expand_dims(positive_ids, 1))
    else:
        valid = tf.ones_like(ids, tf.bool)
    valid = tf.broadcast_to(valid, tf.shape(neg_logits))
    return pos_logit, neg_logits, valid


class LogitLoss(abc.ABC):
    """Turns ``(pos_logit [M], neg_logits [M, N], valid [M, N])`` into a per-row loss ``[M]``."""

    logq_correction: bool = True
    """Whether log-Q corrected logits are what this loss expects (softmax losses: yes)."""

    @abc.abstractmethod
    def __call__(self, pos_logit: Any, neg_logits: Any, valid: Any) -> Any:
        """Per-row loss ``[M]``; invalid negatives contribute nothing."""


class SoftmaxCrossEntropy(LogitLoss):
    """``-log softmax`` of the positive among itself and the valid negatives."""

    def __call__(self, pos_logit: Any, neg_logits: Any, valid: Any) -> Any:
        neg_logits = tf.where(valid, neg_logits, neg_logits.dtype.min)
        logits = tf.concat([pos_logit[:, None], neg_logits], axis=1)  # [M, 1 + N]
        return tf.reduce_logsumexp(logits, axis=1) - pos_logit


class GeneralisedBCE(LogitLoss):
    """gSASRec's gBCE (Petrov & Macdonald, RecSys 2023); ``beta = 1`` is plain BCE.

    ``-(β log σ(s⁺) + Σ_j log(1 - σ(s_j))) / (1 + n)`` over the ``n`` valid negatives of a row.
    ``β < 1`` lowers the positive's weight, which counters the overconfidence that negative
    sampling causes; :meth:`beta_for` gives the paper's ``β`` from its calibration parameter ``t``.
    Logits are not log-Q corrected: σ(s) is read as a probability per item, and the paper's
    calibration assumes uniform sampling.
    """

    logq_correction = False

    def __init__(self, beta: float = 1.0) -> None:
        if beta <= 0:
            raise ValueError(f"gBCE beta must be > 0, got {beta}")
        self.beta = beta

    @staticmethod
    def beta_for(t: float, negatives_per_positive: int, num_items: int) -> float:
        """The paper's ``β = α (t (1 - 1/α) + 1/α) = 1 - t (1 - α)``, with the sampling rate
        ``α = k / (|I| - 1)`` (capped at 1): ``t = 0`` is BCE, ``t = 1`` fully calibrated."""
        if not 0.0 <= t <= 1.0:
            raise ValueError(f"gBCE t must be in [0, 1], got {t}")
        alpha = min(1.0, negatives_per_positive / max(num_items - 1, 1))
        return 1.0 - t * (1.0 - alpha)

    def __call__(self, pos_logit: Any, neg_logits: Any, valid: Any) -> Any:
        valid = tf.cast(valid, neg_logits.dtype)
        # -log σ(s) = softplus(-s); -log(1 - σ(s)) = softplus(s): stable for any logit.
        total = self.beta * tf.nn.softplus(-pos_logit) + tf.reduce_sum(valid * tf.nn.softplus(neg_logits), 1)
        return total / (1.0 + tf.reduce_sum(valid, axis=1))


def sampled_softmax_loss(
    query: Any,
    positive: Any,
    positive_ids: Any,
    negatives: Any,
    negative_ids: Any,
    positive_log_q: Any,
    negative_log_q: Any,
    temperature: float = 1.0,
    remove_accidental_hits: bool = True,
) -> Any:
    """Softmax cross-entropy of each positive against shared sampled negatives.

    Each logit ``<q, e_j> / T`` is corrected by ``- log Q(j)`` (the probability that the
    sampler proposes j), which makes the sampled softmax an unbiased estimate of the full
    softmax's gradient for any sampler. Negatives equal to the row's positive are
    "accidental hits" and are removed from that row's softmax.

    Args:
        query: ``[B, d]``; positive: ``[B, d]``; positive_ids: ``[B]``.
        negatives: ``[N, d]``; negative_ids: ``[N]``.
        positive_log_q: ``[B]``; negative_log_q: ``[N]``: log sampling probabilities.

    Returns:
        per-example loss ``[B]``.
    """
    logits = candidate_logits(
        query,
        positive,
        positive_ids,
        negatives,
        negative_ids,
        positive_log_q,
        negative_log_q,
        temperature,
        remove_accidental_hits,
    )
    return SoftmaxCrossEntropy()(*logits)


# --------------------------------------------------------------------------- samplers


class SeedStream:
    """Stateless random seeds ``[seed, counter]``, the counter a variable (checkpointed with the run).

    Draws are then a function of the seed and of how many draws came before, so a run resumed
    from a checkpoint draws what the uninterrupted run would have.

    Args:
        seed: base seed; None = drawn from numpy's global generator (seeded by
            ``keras.utils.set_random_seed``).
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = int(np.random.randint(0, 2**31 - 1)) if seed is None else int(seed)
        self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="seed_counter")

    def next(self) -> Any:
        """A fresh stateless seed, int64 ``[2]``."""
        count = self.counter.assign_add(1)
        return tf.stack([tf.constant(self.seed, tf.int64), count])


class CandidateSampler:
    """Samples negative item ids (with replacement) from a fixed distribution over ``1..n``.

    Args:
        probabilities: ``[num_embeddings]`` sampling probabilities; entry 0 (padding) must be 0.
        seed: see :class:`SeedStream`.
    """

    def __init__(self, probabilities: np.ndarray, seed: int | None = None) -> None:
        p = np.asarray(probabilities, np.float64)
        if p[0] != 0 or np.any(p < 0) or not np.isclose(p.sum(), 1.0):
            raise ValueError("sampling probabilities must be >= 0, sum to 1 and be 0 for padding")
        self.probabilities = p
        self.log_q = tf.constant(np.log(np.maximum(p, 1e-30)), tf.float32)  # [V]
        self.cdf = tf.constant(np.cumsum(p), tf.float64)  # [V]
        self.seeds = SeedStream(seed)

    @classmethod
    def from_counts(
        cls, counts: np.ndarray, kind: str = "popularity", alpha: float = 0.75, seed: int | None = None
    ) -> CandidateSampler:
        """A sampler over the items with training ``counts`` (``[num_embeddings]``, entry 0 = padding).

        ``popularity``: q ∝ (count + 1)^alpha (every item can be drawn); ``uniform``: q = 1/n;
        ``log_uniform``: Zipf over the popularity rank r = 0, 1, ... (ties by id),
        ``q(r) = log((r + 2) / (r + 1)) / log(n + 1)``, the distribution of TensorFlow's
        ``log_uniform_candidate_sampler`` without having to renumber items by popularity.
        """
        if kind not in SAMPLERS:
            raise ValueError(f"unknown sampler {kind!r}; choose one of {SAMPLERS}")
        counts = np.asarray(counts, float)
        if kind == "uniform":
            weights = np.ones(len(counts))
        elif kind == "popularity":
            weights = (counts + 1.0) ** alpha
        else:
            order = np.argsort(-counts[1:], kind="stable")  # item index by rank
            rank = np.empty(len(order), np.int64)
            rank[order] = np.arange(len(order))
            weights = np.concatenate([[0.0], np.log((rank + 2.0) / (rank + 1.0))])
        weights[0] = 0.0
        return cls(weights / weights.sum(), seed)

    def sample(self, n: Any) -> Any:
        """``n`` ids int32 ``[n]``, drawn by inverting the CDF (O(n log V))."""
        u = tf.random.stateless_uniform(tf.reshape(n, [1]), self.seeds.next(), dtype=tf.float64)
        ids = tf.searchsorted(self.cdf, u * self.cdf[-1], side="right", out_type=tf.int32)
        return tf.minimum(ids, tf.shape(self.cdf, out_type=tf.int32)[0] - 1)


# --------------------------------------------------------------------------- negatives


class Negatives(abc.ABC):
    """A source of candidate negatives for a batch of ``M`` positives."""

    @abc.abstractmethod
    def draw(self, positive_ids: Any) -> Any:
        """Candidate ids: ``[N]`` shared by the batch, or ``[M, N]`` per positive."""

    @abc.abstractmethod
    def expected_count(self, ids: Any, num_positives: Any) -> Any:
        """How many times one :meth:`draw` is expected to propose each of ``ids`` (any shape),
        for one row: the ``Q`` of the log-Q correction."""

    @property
    def variables(self) -> list[Any]:
        """Random state to checkpoint."""
        return []


class AllItems(Negatives):
    """Every item ``1..num_embeddings-1`` once: with it the softmax is the full softmax.

    Args:
        num_embeddings: number of items + 1 (padding).
    """

    def __init__(self, num_embeddings: int) -> None:
        self.num_embeddings = num_embeddings

    def draw(self, positive_ids: Any) -> Any:
        return tf.range(1, self.num_embeddings, dtype=tf.int32)

    def expected_count(self, ids: Any, num_positives: Any) -> Any:
        return tf.ones(tf.shape(ids), tf.float32)


class SampledNegatives(Negatives):
    """``num`` ids from a :class:`CandidateSampler`, shared by the batch or drawn per positive.

    Args:
        sampler: the proposal distribution.
        num: negatives drawn per batch (shared) or per positive.
        per_positive: draw ``num`` for each positive instead of once for the batch.
    """

    def __init__(self, sampler: CandidateSampler, num: int, per_positive: bool = False) -> None:
        if num < 1:
            raise ValueError(f"num_negatives must be >= 1, got {num}")
        self.sampler, self.num, self.per_positive = sampler, num, per_positive

    def draw(self, positive_ids: Any) -> Any:
        if not self.per_positive:
            return self.sampler.sample(self.num)
        rows = tf.shape(positive_ids)[0]
        return tf.reshape(self.sampler.sample(rows * self.num), [rows, self.num])

    def expected_count(self, ids: Any, num_positives: Any) -> Any:
        return self.num * tf.exp(tf.gather(self.sampler.log_q, ids))

    @property
    def variables(self) -> list[Any]:
        return [self.sampler.seeds.counter]


class InBatchNegatives(Negatives):
    """The batch's positives as everyone's negatives (their own and equal ids are accidental hits).

    Positives are draws from the training targets' distribution ``p``, so a batch proposes item
    j about ``n · p(j)`` times: popular items are over-represented as negatives unless
    corrected (Yi et al., RecSys 2019).

    Args:
        target_probabilities: ``p`` ``[num_embeddings]``, the items' frequency as training targets.
        max_candidates: at most this many positives are used (a uniform random subset when a
            batch has more, e.g. ``[B, L]`` targets); None = all.
        seed: see :class:`SeedStream`.
    """

    def __init__(
        self, target_probabilities: np.ndarray, max_candidates: int | None = None, seed: int | None = None
    ) -> None:
        p = np.asarray(target_probabilities, np.float64)
        if np.any(p < 0) or not np.isclose(p.sum(), 1.0):
            raise ValueError("target probabilities must be >= 0 and sum to 1")
        self.probabilities = tf.constant(p, tf.float32)
        self.max_candidates = max_candidates
        self.seeds = SeedStream(seed)

    def _size(self, num_positives: Any) -> Any:
        if self.max_candidates is None:
            return num_positives
        return tf.minimum(num_positives, self.max_candidates)

    def draw(self, positive_ids: Any) -> Any:
        if self.max_candidates is None:
            return positive_ids
        m = tf.shape(positive_ids)[0]
        order = tf.argsort(tf.random.stateless_uniform([m], self.seeds.next()))
        return tf.gather(positive_ids, order[: self._size(m)])

    def expected_count(self, ids: Any, num_positives: Any) -> Any:
        n = tf.cast(self._size(num_positives), tf.float32)
        return n * tf.gather(self.probabilities, ids)

    @property
    def variables(self) -> list[Any]:
        return [self.seeds.counter]


# --------------------------------------------------------------------------- the task


class RetrievalTask:
    """The retrieval loss: interest selection, candidates, corrected logits, loss.

    Args:
        negatives: sources of negatives; several are mixed (their candidates concatenated,
            every logit corrected by the summed expected count of its id).
        loss: the loss on the logits.
        temperature: logits are divided by it.
        remove_accidental_hits: drop candidates equal to the row's target.
        logq_correction: subtract ``log Q`` from the logits (only for losses that expect it).
        interest_selection: how the K interests meet the target: ``"hard"``
            (:func:`select_interest`, ComiRec), ``"label_aware"`` (:func:`label_aware_attention`,
            MIND), or ``"max"``: the positive and every negative scored by its best interest
            (:func:`interest_scores`), as the search ranks items, so that an interest scoring
            wrong items high is corrected too (under ``"hard"`` only the chosen interest meets
            the negatives).
        label_aware_power: MIND's ``p`` for ``"label_aware"``.
    """

    def __init__(
        self,
        negatives: Sequence[Negatives],
        loss: LogitLoss | None = None,
        temperature: float = 1.0,
        remove_accidental_hits: bool = True,
        logq_correction: bool = True,
        interest_selection: str = "hard",
        label_aware_power: float = 1.0,
    ) -> None:
        if not negatives:
            raise ValueError("a retrieval task needs at least one source of negatives")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if interest_selection not in INTEREST_SELECTIONS:
            raise ValueError(
                f"unknown interest selection {interest_selection!r}; choose one of {INTEREST_SELECTIONS}"
            )
        if label_aware_power < 0:
            raise ValueError(f"label_aware_power must be >= 0, got {label_aware_power}")
        self.negatives = list(negatives)
        self.loss = loss or SoftmaxCrossEntropy()
        self.temperature = temperature
        self.remove_accidental_hits = remove_accidental_hits
        self.logq_correction = logq_correction and self.loss.logq_correction
        self.interest_selection = interest_selection
        self.label_aware_power = label_aware_power

    @property
    def variables(self) -> list[Any]:
        """The task's random state (seed counters), to checkpoint with the model."""
        return [v for source in self.negatives for v in source.variables]

    def select(self, interests: Any, target: Any) -> Any:
        """The training query ``[B, d]`` from interests ``[B, K, d]`` and target embeddings ``[B, d]``."""
        if self.interest_selection == "label_aware":
            return label_aware_attention(interests, target, self.label_aware_power)
        if self.interest_selection == "max":  # every candidate scored by its best interest
            return interests
        return select_interest(interests, target)

    def _log_q(self, ids: Any, num_positives: Any) -> Any:
        if not self.logq_correction:
            return tf.zeros(tf.shape(ids), tf.float32)
        count = tf.add_n([s.expected_count(ids, num_positives) for s in self.negatives])
        return tf.math.log(tf.maximum(count, 1e-30))

    def per_example(self, outputs: Any, target_ids: Any, embed: Callable[[Any], Any]) -> tuple[Any, Any]:
        """Loss per real target ``[M]`` and those targets' ids ``[M]`` (arguments as :meth:`__call__`)."""
        target_ids = tf.cast(target_ids, tf.int32)
        if target_ids.shape.rank == 2:
            at = tf.where(target_ids > 0)  # [M, 2] (row, position) of every real target
            query, target_ids = tf.gather_nd(outputs, at), tf.gather_nd(target_ids, at)  # [M, d], [M]
            positive = embed(target_ids)
        else:
            positive = embed(target_ids)  # [B, d]
            query = self.select(outputs, positive)  # [B, d], or [B, K, d] for "max"
        if self._catalogue_softmax:
            return self._catalogue_cross_entropy(query, target_ids, embed), target_ids
        m = tf.shape(target_ids)[0]
        positive_log_q = self._log_q(target_ids, m)  # [M]
        pos_logit, neg_logits, valid = None, [], []
        for source in self.negatives:
            ids = source.draw(target_ids)  # [N] or [M, N]
            pos_logit, neg, ok = candidate_logits(
                query,
                positive,
                target_ids,
                embed(ids),
                ids,
                positive_log_q,
                self._log_q(ids, m),
                self.temperature,
                self.remove_accidental_hits,
            )
            neg_logits.append(neg)
            valid.append(ok)
        loss = self.loss(pos_logit, tf.concat(neg_logits, 1), tf.concat(valid, 1))
        return loss, target_ids

    @property
    def _catalogue_softmax(self) -> bool:
        """Whether the task is the plain full softmax (every item once, accidental hits removed):
        the cross-entropy over the catalogue, computed by one fused op."""
        return (
            len(self.negatives) == 1
            and isinstance(self.negatives[0], AllItems)
            and type(self.loss) is SoftmaxCrossEntropy
            and self.remove_accidental_hits
        )

    def _catalogue_cross_entropy(self, query: Any, target_ids: Any, embed: Callable[[Any], Any]) -> Any:
        """``-log softmax`` of each target over items ``1..V-1``, ``[M]``. The generic path's
        logits minus the positive's column (its accidental hit) plus the positive's own logit
        are exactly these logits, and ``log Q = 0`` for every item; the fused op avoids copying
        the ``[M, V]`` logits three times (a full-softmax step of Beauty SASRec: 588 -> 448 ms)."""
        source = self.negatives[0]
        assert isinstance(source, AllItems)
        ids = source.draw(target_ids)  # [V - 1]: 1..V-1
        logits = interest_scores(query, embed(ids), per_row=False) / self.temperature  # [M, V - 1]
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target_ids - 1, logits=logits)

    def __call__(self, outputs: Any, target_ids: Any, embed: Callable[[Any], Any]) -> Any:
        """Mean loss over the batch's targets; ``embed`` maps ids to ``[.., d]``.

        Args:
            outputs: interests ``[B, K, d]`` with targets ``[B]`` (one target per row, an
                interest selected per row), or per-position outputs ``[B, L, d]`` with
                targets ``[B, L]`` (0 = no target at that position; objectives
                ``all_positions`` and ``cloze``).
        """
        return tf.reduce_mean(self.per_example(outputs, target_ids, embed)[0])


class SampledSoftmaxTask(RetrievalTask):
    """Sampled softmax with log-Q correction against ``num_negatives`` shared negatives.

    Args:
        sampler: negative sampler over the catalogue.
        num_negatives: negatives drawn per batch (shared by its rows).
        other arguments: as :class:`RetrievalTask`.
    """

    def __init__(
        self,
        sampler: CandidateSampler,
        num_negatives: int,
        temperature: float = 1.0,
        remove_accidental_hits: bool = True,
        interest_selection: str = "hard",
        label_aware_power: float = 1.0,
    ) -> None:
        super().__init__(
            [SampledNegatives(sampler, num_negatives)],
            SoftmaxCrossEntropy(),
            temperature,
            remove_accidental_hits,
            interest_selection=interest_selection,
            label_aware_power=label_aware_power,
        )

    @property
    def sampler(self) -> CandidateSampler:
        return self._sampled.sampler

    @property
    def num_negatives(self) -> int:
        return self._sampled.num

    @property
    def _sampled(self) -> SampledNegatives:
        source = self.negatives[0]
        assert isinstance(source, SampledNegatives)
        return source


def build_task(
    loss: str,
    *,
    sampler: CandidateSampler,
    num_negatives: int,
    target_probabilities: np.ndarray,
    negatives_per_positive: int = 0,
    in_batch_candidates: int | None = None,
    gbce_t: float = 0.75,
    temperature: float = 1.0,
    remove_accidental_hits: bool = True,
    logq_correction: bool = True,
    interest_selection: str = "hard",
    label_aware_power: float = 1.0,
) -> RetrievalTask:
    """The task named ``loss`` (one of :data:`LOSSES`).

    * ``sampled_softmax``: softmax over sampled negatives, log-Q corrected.
    * ``full_softmax``: softmax over the whole catalogue (memory ``[targets, items]``).
    * ``in_batch``: softmax over the batch's other targets, log-Q corrected by their frequency.
    * ``mixed``: in-batch + sampled negatives in one softmax, corrected by the mixture.
    * ``bce`` / ``gbce``: binary cross-entropy against sampled negatives; gBCE with calibration
      ``gbce_t`` (gSASRec).

    Args:
        sampler: the sampled negatives' distribution (sampled_softmax, mixed, bce, gbce).
        num_negatives: sampled negatives per batch, shared by its targets.
        target_probabilities: ``[num_embeddings]``, the items' frequency as training targets
            (in-batch correction); its length also gives the catalogue size.
        negatives_per_positive: ``k > 0`` draws ``k`` negatives for each target instead of
            ``num_negatives`` shared ones.
        in_batch_candidates: cap on the in-batch candidates (None = every target of the batch).
        gbce_t: gSASRec's ``t`` in ``[0, 1]`` (``gbce`` only).
        other arguments: as :class:`RetrievalTask`.
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
    if negatives_per_positive < 0:
        raise ValueError(f"negatives_per_positive must be >= 0, got {negatives_per_positive}")
    num_embeddings = len(target_probabilities)
    per_positive = negatives_per_positive > 0
    k = negatives_per_positive if per_positive else num_negatives

    def sampled() -> SampledNegatives:
        return SampledNegatives(sampler, k, per_positive)

    def in_batch() -> InBatchNegatives:
        return InBatchNegatives(target_probabilities, in_batch_candidates)

    sources: dict[str, Callable[[], list[Negatives]]] = {
        "sampled_softmax": lambda: [sampled()],
        "full_softmax": lambda: [AllItems(num_embeddings)],
        "in_batch": lambda: [in_batch()],
        "mixed": lambda: [in_batch(), sampled()],
        "bce": lambda: [sampled()],
        "gbce": lambda: [sampled()],
    }
    if loss == "bce":
        head: LogitLoss = GeneralisedBCE(1.0)
    elif loss == "gbce":
        head = GeneralisedBCE(GeneralisedBCE.beta_for(gbce_t, k, num_embeddings - 1))
    else:
        head = SoftmaxCrossEntropy()
    return RetrievalTask(
        sources[loss](),
        head,
        temperature,
        remove_accidental_hits,
        logq_correction,
        interest_selection,
        label_aware_power,
    )
