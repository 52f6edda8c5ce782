"""One configuration mechanism for every frozen config dataclass: checks, overrides, files.

A config is a frozen dataclass whose fields hold plain values (``bool``, ``int``, ``float``,
``str``, optionally ``None``), options with a fixed set of values (``Literal[...]``), bags of
extra arguments (``dict[str, Any]``) or nested configs (sections, e.g. ``Config.train``). Its
``__post_init__`` calls :func:`check_fields`, so a config with an unknown option value cannot
be built, whichever way it is made. The same functions serve every config:

* :func:`apply_overrides`: ``section.field=value`` strings (``--set``), typed by the field;
* :func:`update_config` / :func:`config_from_dict`: a (partial) mapping, e.g. a config file;
* :func:`config_to_dict` / :func:`config_to_json`: the config as saved beside an artifact;
* :func:`load_config_file`: a ``.json``, ``.yaml`` or ``.yml`` file as a mapping.

This module imports nothing from :mod:`retrieval` and no TensorFlow: tools check their whole
configuration with it before loading anything heavy.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Opt:
    ...     kind: Literal["adam", "sgd"] = "adam"
    ...     lr: float = 1e-3
    ...     def __post_init__(self) -> None:
    ...         check_fields(self)
    >>> apply_overrides(Opt(), ["kind=sgd", "lr=0.1"])
    Opt(kind='sgd', lr=0.1)
    >>> apply_overrides(Opt(), ["kind=rmsprop"])
    Traceback (most recent call last):
    ValueError: kind: unknown kind 'rmsprop'; expected one of adam, sgd
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

__all__ = [
    "CONFIG_SUFFIXES",
    "apply_overrides",
    "check_fields",
    "config_from_dict",
    "config_to_dict",
    "config_to_json",
    "load_config_file",
    "update_config",
]

C = TypeVar("C")
"""A config dataclass type."""

NULLS = ("none", "null")
"""Override values that mean ``None`` for a field that allows it."""

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
"""Config files :func:`load_config_file` reads."""

_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def field_types(cls: type) -> dict[str, Any]:
    """Field name -> its resolved annotation (string annotations evaluated in the class's module)."""
    if cls not in _FIELD_TYPES:
        hints = typing.get_type_hints(cls)
        _FIELD_TYPES[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _FIELD_TYPES[cls]


def _members(annotation: Any) -> tuple[list[Any], bool]:
    """The types of a (possibly optional) annotation other than ``None``, and whether ``None`` is allowed."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return [a for a in args if a is not type(None)], type(None) in args
    return [annotation], annotation is type(None)


def literal_values(annotation: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal[...]`` annotation (optional or not); ``None`` for any other type.

    Example:
        >>> literal_values(Literal["a", "b"] | None)
        ('a', 'b')
    """
    members, _ = _members(annotation)
    if len(members) == 1 and typing.get_origin(members[0]) is Literal:
        return typing.get_args(members[0])
    return None


def _choices(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _unknown_value(key: str, value: Any, values: Iterable[Any]) -> str:
    """``train.loss: unknown loss 'foo'; expected one of sampled_softmax, ...``."""
    what = key.rpartition(".")[2].replace("_", " ")
    return f"{key}: unknown {what} {value!r}; expected one of {_choices(values)}"


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _is_mapping(annotation: Any) -> bool:
    members, _ = _members(annotation)
    return len(members) == 1 and typing.get_origin(members[0]) in (dict, Mapping)


def check_fields(config: Any) -> None:
    """Checks every ``Literal`` field of a config dataclass against its values; call it from
    ``__post_init__``.

    Raises:
        ValueError: names the field, the valid values and the value given.
    """
    name = type(config).__name__
    for field, annotation in field_types(type(config)).items():
        values = literal_values(annotation)
        value = getattr(config, field)
        if values is None or (value is None and _members(annotation)[1]):
            continue
        if value not in values:
            raise ValueError(_unknown_value(f"{name}.{field}", value, values))


def parse_value(raw: str, annotation: Any, key: str) -> Any:
    """Text (an override's value) as the type ``annotation`` says.

    ``none``/``null`` is ``None`` where the field allows it; ``bool`` takes true/false/1/0;
    a ``Literal`` field one of its values; a ``dict`` field a JSON object.

    Raises:
        ValueError: ``key: expected <type>, got <raw>``.
    """
    members, optional = _members(annotation)
    if optional and raw.lower() in NULLS:
        return None
    if len(members) != 1:
        raise ValueError(f"{key}: cannot parse a value of type {annotation}")
    target = members[0]
    values = literal_values(target)
    if values is not None:
        found = [v for v in values if str(v) == raw]
        if not found:
            raise ValueError(_unknown_value(key, raw, values))
        return found[0]
    if target is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{key}: expected true/false, got {raw!r}")
        return raw.lower() in ("true", "1")
    if target in (int, float, str):
        try:
            return target(raw)
        except ValueError:
            raise ValueError(f"{key}: expected {target.__name__}, got {raw!r}") from None
    if _is_mapping(target):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a JSON object, got {raw!r}")
        return value
    raise ValueError(f"{key}: cannot parse a value of type {annotation}")


def _json_or_text(raw: str) -> Any:
    """A dict field's entry: JSON when it parses (``[64, 32]``, ``false``, ``0.5``), else the text."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _label(cls: type) -> str:
    """How messages name a config: ``RankerConfig`` -> ``ranker``, ``Config`` -> ``config``."""
    return cls.__name__.removesuffix("Config").lower() or "config"


def _has_sections(cls: type) -> bool:
    return any(_is_section(t) for t in field_types(cls).values())


def _settable(cls: type) -> list[str]:
    """What an override may name at this level: fields, and ``NAME.KEY`` for dict fields."""
    types_ = field_types(cls)
    return sorted(types_) + [f"{name}.NAME" for name, t in sorted(types_.items()) if _is_mapping(t)]


def _override(config: Any, parts: list[str], raw: str, item: str, prefix: str) -> Any:
    """``config`` with the field at ``parts`` (a path below ``prefix``) set from the text ``raw``."""
    cls, name, rest = type(config), parts[0], parts[1:]
    types_ = field_types(cls)
    path = prefix + name
    if name not in types_:
        if prefix:
            raise ValueError(f"unknown field {path!r}; {prefix[:-1]} has {_settable(cls)}")
        kind = "section" if _has_sections(cls) and rest else "setting"
        raise ValueError(
            f"unknown {_label(cls)} {kind} {name!r} in {item!r}; choose from {', '.join(_settable(cls))}"
        )
    annotation, current = types_[name], getattr(config, name)
    if _is_section(annotation):
        if not rest:
            raise ValueError(f"{path!r} is a section: set its fields, as in {path}.FIELD=value")
        value = _override(current, rest, raw, item, path + ".")
    elif rest and _is_mapping(annotation):
        value = {**(current or {}), ".".join(rest): _json_or_text(raw)}
    elif rest:
        raise ValueError(f"unknown field {path + '.' + '.'.join(rest)!r}: {path} has no fields")
    else:
        value = parse_value(raw, annotation, path)
    return dataclasses.replace(config, **{name: value})


def apply_overrides(config: C, overrides: Iterable[str]) -> C:
    """``config`` with ``key=value`` overrides applied in order, each value typed by its field.

    A key is a field (``epochs``), a field of a section (``train.epochs``, nested to any depth),
    or an entry of a ``dict`` field (``options.hidden_units``, whose value is JSON, or text when
    it is not JSON).

    Example:
        >>> from retrieval.training.config import Config
        >>> apply_overrides(Config(), ["train.epochs=3", "model.tower=sasrec"]).train.epochs
        3

    Raises:
        ValueError: not ``key=value``, an unknown key (the message lists the valid ones), or a
            value of the wrong type or outside a ``Literal``'s values (listed too).
    """
    form = "section.field=value" if _has_sections(type(config)) else "field=value"
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = [p.strip() for p in key.split(".")]
        if not sep or not all(parts):
            raise ValueError(f"override {item!r} is not of the form {form}")
        config = _override(config, parts, raw.strip(), item, "")
    return config


def _check_value(value: Any, annotation: Any, key: str) -> Any:
    """A value read from a file (JSON or YAML) checked against its field's type; text is parsed
    as an override's would be (YAML reads ``1e-3`` as text)."""
    members, optional = _members(annotation)
    if value is None:
        if optional:
            return None
        raise ValueError(f"{key}: expected {annotation}, got null")
    target = members[0] if len(members) == 1 else None
    values = literal_values(annotation)
    if isinstance(value, str) and target is not str and values is None:
        return parse_value(value, annotation, key)
    if values is not None:
        if value not in values:
            raise ValueError(_unknown_value(key, value, values))
        return value
    if target is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if (
        target in (bool, int, str)
        and isinstance(value, target)
        and (target is bool) == isinstance(value, bool)
    ):
        return value
    if _is_mapping(annotation) and isinstance(value, Mapping):
        return dict(value)
    raise ValueError(f"{key}: expected {getattr(target, '__name__', annotation)}, got {value!r}")


def update_config(config: C, payload: Mapping[str, Any], prefix: str = "") -> C:
    """``config`` with the values of ``payload`` (a mapping shaped like :func:`config_to_dict`'s,
    possibly partial: sections and fields left out keep their values).

    Raises:
        ValueError: an unknown key (the message lists the valid ones) or a value of the wrong type.
    """
    where = prefix[:-1] or _label(type(config))
    if not isinstance(payload, Mapping):
        raise ValueError(f"{where}: expected a mapping of fields, got {payload!r}")
    types_ = field_types(type(config))
    unknown = [str(k) for k in payload if k not in types_]
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)} in {where}; "
            f"valid: {', '.join(sorted(types_))}"
        )
    changes = {}
    for name, value in payload.items():
        annotation = types_[name]
        if _is_section(annotation):
            changes[name] = update_config(getattr(config, name), value, f"{prefix}{name}.")
        else:
            changes[name] = _check_value(value, annotation, prefix + name)
    return dataclasses.replace(config, **changes)  # type: ignore[type-var]


def config_from_dict(cls: type[C], payload: Mapping[str, Any]) -> C:
    """A ``cls`` from a mapping (a saved ``config.json``, a config file); what it leaves out
    keeps ``cls``'s defaults.

    Raises:
        ValueError: as :func:`update_config`.
    """
    return update_config(cls(), payload)


def config_to_dict(config: Any) -> dict[str, Any]:
    """The config as plain JSON-able values, sections as nested mappings."""
    return dataclasses.asdict(config)


def config_to_json(config: Any) -> str:
    """The config as JSON, as saved beside an artifact and printed by ``--print-config``: keys
    sorted, so one config always gives the same text."""
    return json.dumps(config_to_dict(config), indent=2, sort_keys=True)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a config file: ``.json``, or ``.yaml``/``.yml`` (an empty YAML file is ``{}``).

    Raises:
        ValueError: another suffix, an unreadable file, a syntax error, or a document that is
            not a mapping.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in CONFIG_SUFFIXES:
        raise ValueError(
            f"{path}: a config file is {', '.join(CONFIG_SUFFIXES)}, not {suffix or 'no suffix'!r}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read config file {path}: {e.strerror or e}") from None
    try:
        payload = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: not valid {suffix[1:].upper()}: {' '.join(str(e).split())}") from None
    if payload is None and suffix != ".json":
        return {}
    if not isinstance(payload, dict):
        raise ValueError(f"{path}: expected a mapping of sections and fields, got {type(payload).__name__}")
    return payload
