"""The blend of a ranker's own logit with the retrieval score (``g · own + w · s + b``), fitted on
held-out clicks or lists."""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


def fit_blend(
    own: np.ndarray, scores: np.ndarray, labels: np.ndarray, valid: np.ndarray, l2: float = 1e-4
) -> tuple[float, float, float]:
    """``(g, w, b)`` of the logistic regression ``σ(g · own + w · scores + b)`` of the clicks, by
    Newton's method (a small L2 keeps it finite when the clicks are separable).

    Args:
        own: float ``[E, C]`` a ranker's own logits; scores: float ``[E, C]`` the retrieval scores;
        labels: ``[E, C]`` 1 = clicked; valid: bool ``[E, C]`` the real candidates.
    """
    x = np.stack([own[valid], scores[valid], np.ones(int(valid.sum()))], axis=1).astype(np.float64)
    y = np.asarray(labels, np.float64)[valid]
    beta = np.zeros(3)
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ beta, -50, 50)))
        gradient = x.T @ (p - y) / len(y) + l2 * beta
        hessian = (x * (p * (1 - p))[:, None]).T @ x / len(y) + l2 * np.eye(3)
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(beta[0]), float(beta[1]), float(beta[2])


def list_loss(logits: np.ndarray, targets: np.ndarray, present: np.ndarray) -> float:
    """Mean listwise softmax loss ``logsumexp(z) − z_target`` over the lists holding their target.

    Args:
        logits: float ``[n, C]``; targets: bool ``[n, C]`` the target's slot; present: bool ``[n, C]``.
    """
    rows = (targets & present).any(axis=1)
    z = np.where(present[rows], np.asarray(logits, np.float64)[rows], -np.inf)
    top = z.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
    return float(np.mean(lse - z[targets[rows]])) if rows.any() else float("nan")


def fit_list_blend(
    own: np.ndarray, scores: np.ndarray, targets: np.ndarray, present: np.ndarray, l2: float = 1e-4
) -> tuple[float, float]:
    """``(g, w)`` minimising the listwise softmax loss of ``g · own + w · scores`` (a bias does not
    change an order), by damped Newton steps; over the lists holding their target.

    Args:
        own: float ``[n, C]`` a ranker's own logits; scores: float ``[n, C]`` the retrieval scores;
        targets: bool ``[n, C]`` the target's slot; present: bool ``[n, C]`` the real candidates.
    """
    rows = (targets & present).any(axis=1)
    if not rows.any():
        return 0.0, 1.0
    m, y = present[rows], targets[rows]
    x = np.stack([np.where(m, own[rows], 0.0), np.where(m, scores[rows], 0.0)], axis=-1).astype(np.float64)

    def loss(beta: np.ndarray) -> float:
        return list_loss(x @ beta, y, m) + 0.5 * l2 * float(beta @ beta)

    beta = np.zeros(2)
    current = loss(beta)
    for _ in range(50):
        z = np.where(m, x @ beta, -np.inf)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)  # [n, C]
        mean = np.einsum("nc,nci->ni", p, x)
        gradient = (mean - x[y]).mean(axis=0) + l2 * beta
        covariance = np.einsum("nc,nci,ncj->nij", p, x, x) - np.einsum("ni,nj->nij", mean, mean)
        step = np.linalg.solve(covariance.mean(axis=0) + l2 * np.eye(2), gradient)
        for _ in range(30):  # halve the step until the loss does not rise
            trial = beta - step
            if (value := loss(trial)) <= current:
                break
            step /= 2
        else:
            break
        beta, done, current = trial, current - value < 1e-10, value
        if done:
            break
    return float(beta[0]), float(beta[1])


def fit_bias(offset: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> float:
    """``b`` of the logistic regression ``σ(offset + b)`` of the clicks (Newton's method)."""
    z, y = np.asarray(offset, np.float64)[valid], np.asarray(labels, np.float64)[valid]
    rate = float(np.clip(y.mean(), 1e-6, 1 - 1e-6)) if len(y) else 0.5
    b = float(np.log(rate / (1 - rate)) - np.median(z)) if len(y) else 0.0  # near the answer
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(z + b, -50, 50)))
        # Newton's step, clipped: where σ saturates its curvature vanishes and the step explodes.
        step = float(np.clip((p - y).sum() / max(float((p * (1 - p)).sum()), 1e-12), -1.0, 1.0))
        b -= step
        if abs(step) < 1e-10:
            break
    return b
