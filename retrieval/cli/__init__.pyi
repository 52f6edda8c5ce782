"""The public API of :mod:`retrieval.cli` (loaded on first use by ``__init__.py``)."""

from .dispatch import COMMANDS, DISTRIBUTION, Command, install_hint, main

__all__ = ["COMMANDS", "DISTRIBUTION", "Command", "install_hint", "main"]
