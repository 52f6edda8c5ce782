"""Pre-ranking on top of retrieval: click examples from the logs, ranker training, reranking evaluation.

The rankers of :mod:`rankers` are trained on the same logs, split the same way, as the retriever
(:func:`retrieval.data.splits.leave_one_out` of the same data), in the retriever's dense item ids.

**Click examples.** For a user's leave-one-out training sequence ``s`` and a position ``t >= 1``,
one example is one request: the history ``s[:t]`` (the items before ``t``, nothing at or after
it; the last ``max_len`` are read) and the candidates ``s[t]`` (label 1) plus
``num_negatives`` items (label 0), in a random order, 0-padded when too few negatives exist.
Only the last ``positions_per_user`` positions of each user are used, which bounds the retrieval
work below (one search per example) and keeps the examples close to the held-out ones.

**Negatives** (``negatives``, sources joined by ``+`` share ``num_negatives`` evenly):

* ``retrieved`` (default): drawn uniformly from the top-``candidates`` items the retriever
  returns for that very history ("retrieved but not chosen"), the distribution the ranker
  reorders at serving time;
* ``uniform``: uniform over the catalogue;
* ``popularity``: proportional to the item's count in the training sequences.

With ``retrieved_positives_only`` (the default) an example is kept only when its click is among
the retriever's top ``candidates`` for that history: the lists the ranker learns from are then
the lists it reorders at serving time (where a click the retriever missed cannot be reranked).
Without it, every negative is an item the retriever likes and many positives are items it does
not, so a ranker learns to push down what the retriever ranks high.

Every negative is distinct within its example and is never the positive nor any item of the
user's training sequence (neither the history nor a later click, which would be a wrong
label); the held-out validation and test items are not looked at. Draws are seeded (``seed``).

**Validation** (early stopping) uses the same construction for the leave-one-out validation
target: history = the whole training sequence, candidates = the validation item + negatives
(the validation click examples), and also the validation request's whole retrieved list
(``valid_lists``, reranked like the test lists). With the default ``retrieval_fit="lists"``
the blend of the ranker's own part with the retrieval score is fitted on those lists after
every epoch and the monitored metric is their listwise loss; otherwise the validation clicks'
GAUC (``patience`` epochs without improvement stop training; the best epoch's weights are
kept). It is measured before the first epoch too (epoch 0): a ranker that reads the retrieval
scores then orders about as the retriever does, and keeps that when no epoch does better.

**Item vectors**: by default (``item_init="retriever"``) a ranker's item table starts from the
retrieval model's item embeddings, learnt from every training event; the ranker itself sees
only a few clicks per user.

**Item attributes**: when the retrieval model's folder has ``item_attributes.json`` (and
``attributes`` is on), each item's attributes become ids (:class:`AttributeTable`) that the
rankers read as ``history_attributes`` / ``candidate_attributes``.

**Unclicked items** (DSTN only, ``unclicked="previous"``): the logs hold clicks, not impressions,
so "shown but not clicked" is simulated as the first ``num_unclicked`` items the retriever
returned for the user's *previous* request (the history one event shorter) minus the item
clicked at that request. It is a function of the history alone (no later event), built the same
way for training, validation and test (whose previous request is the validation one), and by
the server (:meth:`retrieval.serving.retriever.Retriever.retrieve_many`, when a request brings no
impressions of its own). ``unclicked="none"`` feeds none.

**Retrieval scores**: every candidate of an example carries the retriever's score for that
request (``retrieval_scores``): the max over the request's interests of the inner product with
the retriever's item embedding (:func:`interest_scores`), which for a retrieved item is the score
its search returned and for a uniform or popularity negative (not retrieved) is computed the
same way. Rankers built with ``retrieval_score`` (:class:`rankers.Ranker`) compute
``g · own + w · s + b``; evaluation feeds the search's own scores. Where ``g``, ``w``, ``b`` are
learned is ``retrieval_fit`` (:class:`RankerConfig`): by default on held-out validation lists,
since the retriever's scores of its own training clicks are in-sample.

**Context** (DSTN, ``context_size`` N): the request's top N + 1 retrieved items, in the
retriever's order (``context``); DSTN reads the first N of them that are not the candidate. In
evaluation and serving the scorer takes them from the head of the retrieved list being
reranked, so the context has N items in training, validation, test and serving alike (before,
it was the request's other candidates: 20 in training, 199 at test time, and DSTN's
un-normalised attention sum saw ten times longer lists at test time).

**Evaluation** (:func:`evaluate_reranking`), the full pipeline on the leave-one-out test users:
the retriever returns its top ``candidates`` (default 200) for the test history (history
excluded, as in ``tools/evaluate.py --index``); the retriever's own order gives the
retrieval-only NDCG@10 / HR@10, and each ranker reorders the same list (ties keep the
retriever's order). A user whose target was not retrieved has no positive: NDCG and HR count 0
for them in every row, so all rows are over the same users and comparable. AUC pools every
(candidate, label) pair of all test users; GAUC is the mean of the per-user AUC weighted by the
user's number of candidates (impressions), over the users whose list holds the target and at
least one other item (``gauc_users``).

Names load on first use (``lazy_loader``, from ``__init__.pyi``): ``mitt train-ranker --help``
reads :class:`RankerConfig` here and checks the configuration before anything heavy, and an
eager import would load TensorFlow into it.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
