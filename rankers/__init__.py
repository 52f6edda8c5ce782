"""Keras 3 rankers: score a short candidate list given the user's history (pre-ranking).

Where the towers of :mod:`towers` give one user vector per user so that a whole catalogue
can be searched, a ranker looks at each candidate with the history (target attention,
interest evolution, feature interactions, the other candidates of the request) and returns
one click logit per candidate, for the few hundred items retrieval produced.

Every ranker takes ``{"history": int [B, L], "candidates": int [B, C], "retrieval_scores":
float [B, C]}`` (0 = padding, histories left-padded; the retriever's score of each candidate,
which by default the ranker adds to its own logit through a learned ``w · s + b`` and starts
from, see :class:`Ranker`) plus optional ``"history_attributes"`` ``[B, L, A]``,
``"candidate_attributes"`` ``[B, C, A]``, ``"unclicked"`` ``[B, U]`` and ``"context"`` ``[B, N]``
(DSTN), and returns float32 logits ``[B, C]``; it is trained with :func:`click_loss`
(per-candidate sigmoid cross-entropy). Rankers are chosen by name::

    from rankers import build_ranker
    ranker = build_ranker("din", num_items=1000, dim=16, max_len=50, activation="dice")
    ranker.compile(optimizer="adam")
    ranker.fit({"history": history, "candidates": candidates, "retrieval_scores": scores}, labels)

Registered: ``din`` (DIN), ``dien`` (DIEN), ``afm`` (AFM), ``dstn`` (DSTN, interactive attention).
Rankers use :mod:`towers` (the item table) and never the retrieval, index or tools packages.
"""

from rankers import afm, dien, din, dstn  # noqa: F401  (importing registers the rankers)
from rankers.afm import AFM
from rankers.base import Ranker, click_loss
from rankers.dien import DIEN
from rankers.din import DIN
from rankers.dstn import DSTN
from rankers.registry import build_ranker, ranker_class, ranker_names, register_ranker

__all__ = [
    "AFM",
    "DIEN",
    "DIN",
    "DSTN",
    "Ranker",
    "build_ranker",
    "click_loss",
    "ranker_class",
    "ranker_names",
    "register_ranker",
]
