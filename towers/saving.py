"""A Keras config made of the arguments a layer or model was constructed with."""

from __future__ import annotations

import inspect
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
    with the constructors of its bases in turn (up to :class:`ConstructorConfig`), whose
    defaults fill what is not given: a subclass that passes its base's arguments on records
    them too. What none of them names (``name``, ``dtype``: the Keras base's config holds them)
    is left out.

    Raises:
        TypeError: the arguments do not fit the constructor.

    Example:
        >>> constructor_arguments(ItemTower, (11, 16), {"name": "items"})
        {'num_embeddings': 11, 'dim': 16, 'num_attributes': 0, 'max_attributes': 0, 'id_dropout': 0.0}
    """
    arguments: dict[str, Any] = {}
    for base in cls.__mro__:
        if not issubclass(base, ConstructorConfig):
            break
        if "__init__" not in vars(base):
            continue
        signature = inspect.signature(base.__init__)
        bound = signature.bind_partial(None, *args, **kwargs)
        bound.apply_defaults()
        args, kwargs = (), {}
        for name, value in list(bound.arguments.items())[1:]:  # after self
            if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                kwargs = value  # what this constructor passes on to its base's
            else:
                arguments.setdefault(name, value)
    return arguments
