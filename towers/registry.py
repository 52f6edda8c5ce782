"""Registry of user towers by name; registering also makes a class Keras-serializable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import keras

_TOWERS: dict[str, type] = {}
T = TypeVar("T", bound=type)


def register_tower(name: str) -> Callable[[T], T]:
    """Class decorator: registers a user tower under ``name`` and for Keras serialization."""

    def wrap(cls: T) -> T:
        if name in _TOWERS:
            raise ValueError(f"user tower {name!r} is already registered")
        registered = keras.saving.register_keras_serializable(package="towers")(cls)
        _TOWERS[name] = registered
        return registered

    return wrap


def tower_names() -> list[str]:
    """Names of every registered user tower."""
    return sorted(_TOWERS)


def tower_class(name: str) -> type:
    """The user-tower class registered as ``name``."""
    if name not in _TOWERS:
        raise ValueError(f"unknown user tower {name!r}; choose one of {tower_names()}")
    return _TOWERS[name]


def build_user_tower(name: str, **kwargs: Any) -> Any:
    """Instantiates the user tower registered as ``name`` with its constructor arguments."""
    return tower_class(name)(**kwargs)
