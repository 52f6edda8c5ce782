"""Registry of rankers by name; registering also makes a class Keras-serializable."""

from __future__ import annotations

from towers.registry import Registry

RANKERS = Registry("ranker", package="rankers")
register_ranker = RANKERS.register
ranker_names = RANKERS.names
ranker_class = RANKERS.get
build_ranker = RANKERS.build
