"""Registries of models by name; registering also makes a class Keras-serializable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import keras

T = TypeVar("T", bound=type)


class Registry:
    """Classes of one kind (user towers, rankers) by name.

    Example:
        >>> RANKERS = Registry("ranker", package="rankers")
        >>> @RANKERS.register("din")
        ... class DIN(keras.Model): ...
        >>> RANKERS.build("din", num_items=1000, dim=16, max_len=50)
    """

    def __init__(self, kind: str, package: str) -> None:
        """``kind`` names the classes in errors; ``package`` is their Keras serialization package."""
        self.kind = kind
        self.package = package
        self._classes: dict[str, type] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: registers a class under ``name`` and for Keras serialization."""

        def wrap(cls: T) -> T:
            if name in self._classes:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            registered = keras.saving.register_keras_serializable(package=self.package)(cls)
            self._classes[name] = registered
            return registered

        return wrap

    def names(self) -> list[str]:
        """Every registered name."""
        return sorted(self._classes)

    def get(self, name: str) -> type:
        """The class registered as ``name``."""
        if name not in self._classes:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {self.names()}")
        return self._classes[name]

    def build(self, name: str, **kwargs: Any) -> Any:
        """Instantiates the class registered as ``name`` with its constructor arguments."""
        return self.get(name)(**kwargs)


USER_TOWERS = Registry("user tower", package="towers")
register_tower = USER_TOWERS.register
tower_names = USER_TOWERS.names
tower_class = USER_TOWERS.get
build_user_tower = USER_TOWERS.build
