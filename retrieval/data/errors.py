"""The one error of the data layer (no dependencies, so that naming it loads nothing else)."""

from __future__ import annotations


class DataError(ValueError):
    """Input data that cannot be read: the message names the file, the line and the problem."""
