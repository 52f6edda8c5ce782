"""A Keras config made of the arguments a layer or model was constructed with."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any, ClassVar, Self

import keras


class ConstructorConfig:
    """Mixin for a Keras layer or model whose config is its constructor's arguments.

    The arguments are recorded when the object is created (:func:`constructor_arguments`), so
    a class adding arguments writes no ``get_config`` and its config cannot drift from its
    constructor: ``cls.from_config(obj.get_config())`` calls ``cls`` with what ``obj`` was built
    with. A ``None`` the constructor resolves (``attention_dim``: ``4 d``) is saved as ``None``
    and resolved again when loaded. Put it before the Keras class among the bases.

    Attributes:
        nested: the arguments that are Keras objects (the item tower given to a user tower),
            serialized in the config and rebuilt by :meth:`from_config`.

    Example:
        >>> class Scale(ConstructorConfig, keras.layers.Layer):
        ...     def __init__(self, factor: float = 2.0, **kwargs: Any) -> None:
        ...         super().__init__(**kwargs)
        ...         self.factor = factor
        >>> Scale(3.0).get_config()["factor"]
        3.0
    """

    nested: ClassVar[tuple[str, ...]] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        instance = super().__new__(cls, *args, **kwargs)
        # Not through the layer's __setattr__, which tracks what it is given: a record, not state.
        object.__setattr__(instance, "_constructor_arguments", constructor_arguments(cls, args, kwargs))
        return instance

    def get_config(self) -> dict[str, Any]:
        arguments: dict[str, Any] = self._constructor_arguments  # type: ignore[attr-defined]
        config = {**arguments, **super().get_config()}  # type: ignore[misc]
        for name in self.nested:
            config[name] = keras.saving.serialize_keras_object(arguments[name])
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Self:
        config = dict(config)
        for name in cls.nested:
            config[name] = keras.saving.deserialize_keras_object(config[name])
        return cls(**config)


def constructor_arguments(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``cls(*args, **kwargs)`` by name, defaults included.

    Those that ``cls.__init__`` names come first; what it takes through ``**kwargs`` is matched
    with its bases' constructors in turn (:func:`constructor_parameters`), whose defaults fill
    what is not given: a subclass that passes its base's arguments on records them too. What
    none of them names (``name``, ``dtype``: the Keras base's config holds them) is left out.

    Raises:
        TypeError: arguments that do not bind to ``cls.__init__`` (too many positional ones,
            one given twice); an unknown name goes on to the Keras base, which refuses it.

    Example:
        >>> constructor_arguments(ItemTower, (11, 16), {"name": "items"})
        {'num_embeddings': 11, 'dim': 16, 'num_attributes': 0, 'max_attributes': 0, 'id_dropout': 0.0}
    """
    arguments: dict[str, Any] = {}
    for signature in _constructors(cls):
        bound = signature.bind_partial(None, *args, **kwargs)
        bound.apply_defaults()
        args, kwargs = (), {}
        for name, value in list(bound.arguments.items())[1:]:  # after self
            if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                kwargs = value  # what this constructor passes on to its base's
            else:
                arguments.setdefault(name, value)
    return arguments


def constructor_parameters(cls: type) -> list[str]:
    """The names of the arguments ``cls(...)`` takes: its constructor's, then those of its bases'
    constructors that it takes through ``**kwargs`` and passes on (down to
    :class:`ConstructorConfig`), so that a subclass need not repeat its base's signature.

    Example:
        >>> constructor_parameters(towers.bsarec.BSARecTower)[:3]
        ['filter_alpha', 'filter_cutoff', 'item_tower']
    """
    names: list[str] = []
    for signature in _constructors(cls):
        for name, parameter in list(signature.parameters.items())[1:]:  # after self
            if parameter.kind is not inspect.Parameter.VAR_KEYWORD and name not in names:
                names.append(name)
    return names


def _constructors(cls: type) -> Iterator[inspect.Signature]:
    """The signatures of ``cls``'s constructor and, while each takes ``**kwargs``, of the next
    base's that defines one (the Keras base's left out)."""
    for base in cls.__mro__:
        if not issubclass(base, ConstructorConfig):
            return
        if "__init__" in vars(base):
            signature = inspect.signature(base.__init__)
            yield signature
            kinds = [p.kind for p in signature.parameters.values()]
            if inspect.Parameter.VAR_KEYWORD not in kinds:
                return
