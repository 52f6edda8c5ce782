"""Helpers of the data tests: the settings of their Hypothesis tests."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def reproducible(max_examples: int) -> settings:
    """Hypothesis settings drawing the same ``max_examples`` files every run (nothing stored
    between runs), with no deadline and no health check on slow draws: a loaded machine must
    not fail a test that reads files."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
