"""ConstructorConfig: a layer's config is the arguments it was constructed with."""

from __future__ import annotations

from typing import Any

import keras
import pytest

from towers import ItemTower
from towers.registry import tower_class
from towers.saving import ConstructorConfig, constructor_arguments, constructor_parameters


@keras.saving.register_keras_serializable(package="test_saving")
class Base(ConstructorConfig, keras.layers.Layer):
    def __init__(self, size: int, scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size, self.scale = size, scale


class PassesOn(Base):
    """Takes its base's arguments through ``**kwargs`` (as the rankers do)."""

    def __init__(self, *, extra: str = "x", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extra = extra


class Fixes(Base):
    """Names its base's argument itself and passes it positionally (as the transformer towers do)."""

    def __init__(self, size: int, scale: float = 3.0, **kwargs: Any) -> None:
        super().__init__(size, 1.0, **kwargs)


@keras.saving.register_keras_serializable(package="test_saving")
class Holds(ConstructorConfig, keras.layers.Layer):
    nested = ("inner",)

    def __init__(self, inner: keras.layers.Layer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inner = inner


def test_arguments_by_name_with_the_defaults_and_without_the_keras_ones() -> None:
    assert constructor_arguments(Base, (4,), {"name": "b", "dtype": "float32"}) == {"size": 4, "scale": 1.0}
    config = Base(4, scale=2.0, name="b").get_config()
    assert set(config) == {"size", "scale", "name", "trainable", "dtype"}  # the Keras base's too
    assert (config["size"], config["scale"], config["name"]) == (4, 2.0, "b")


def test_arguments_passed_on_to_the_base_are_recorded_with_the_base_defaults() -> None:
    assert constructor_arguments(PassesOn, (), {"size": 5}) == {"extra": "x", "size": 5, "scale": 1.0}
    clone = PassesOn.from_config(PassesOn(size=5, extra="y", scale=0.5).get_config())
    assert (clone.size, clone.scale, clone.extra) == (5, 0.5, "y")


class Closed(Base):
    """Takes no ``**kwargs``: its base's ``scale`` cannot be given."""

    def __init__(self, size: int) -> None:
        super().__init__(size, 0.5)


def test_the_parameters_are_those_of_the_constructors_that_pass_kwargs_on() -> None:
    assert constructor_parameters(PassesOn) == ["extra", "size", "scale"]
    assert constructor_parameters(Closed) == ["size"]
    assert constructor_arguments(Closed, (2,), {}) == {"size": 2}
    bsarec = constructor_parameters(tower_class("bsarec"))  # its own, then the transformer stack's
    assert bsarec[:2] == ["filter_alpha", "filter_cutoff"]
    assert {"num_blocks", "fusion", "max_len"} < set(bsarec)


def test_the_outermost_constructor_wins_over_what_it_passes_its_base() -> None:
    layer = Fixes(2)
    assert layer.scale == 1.0 and layer.get_config()["scale"] == 3.0  # what Fixes was given
    assert Fixes.from_config(layer.get_config()).get_config() == layer.get_config()


def test_wrong_arguments_are_refused_as_the_constructor_would() -> None:
    with pytest.raises(ValueError, match="colour"):  # Keras's own check of what reaches it
        Base(4, colour="red")
    with pytest.raises(TypeError):
        Base(4, 2.0, 1)


def test_nested_layers_are_serialized_and_rebuilt() -> None:
    layer = Holds(Base(3, name="inner"))
    config = layer.get_config()
    assert config["inner"]["config"]["size"] == 3  # a serialized Keras object, not the layer
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(clone.inner, Base) and clone.inner is not layer.inner
    assert clone.get_config() == config


def test_configs_written_by_the_former_get_config_load() -> None:
    # What the hand-written get_config saved: resolved values, and no num_interests for the
    # transformer towers (always 1).
    item_tower = keras.saving.serialize_keras_object(ItemTower(11, 8))
    sa = tower_class("sa").from_config(
        {"name": "sa", "item_tower": item_tower, "max_len": 5, "num_interests": 2, "attention_dim": 32,
         "attention_penalty": 0.0, "fusion": "none", "side_features": {}}
    )  # fmt: skip
    assert (sa.num_interests, sa.attention_dim) == (2, 32)
    sasrec = tower_class("sasrec").from_config(
        {"name": "sasrec", "item_tower": item_tower, "max_len": 5, "num_blocks": 1, "num_heads": 2,
         "dropout": 0.1, "fusion": "none", "side_features": {}}
    )  # fmt: skip
    assert (sasrec.num_interests, len(sasrec.blocks), sasrec.num_heads, sasrec.dropout_rate) == (1, 1, 2, 0.1)
    assert sasrec.get_config()["num_interests"] == 1
