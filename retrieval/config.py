"""One configuration mechanism for every frozen config dataclass: checks, overrides, files.

A config is a frozen dataclass whose fields hold plain values (``bool``, ``int``, ``float``,
``str``, optionally ``None``), options with a fixed set of values (``Literal[...]``), lists of
text (``tuple[str, ...]``: paths given by a repeatable flag), bags of extra arguments
(``dict[str, Any]``) or nested configs (sections, e.g. ``Config.train``). A
numeric field declares the values it may take beside it, ``dim: Annotated[int, Range(1)]``.
Its ``__post_init__`` calls :func:`check_fields`, so a config with an unknown option value or a
number out of its range cannot be built, whichever way it is made; the error
(:class:`FieldError`) names the key (``train.learning_rate=-1.0``) or flag (``--lr -1.0``) the
value came from. The same functions serve every config:

* :func:`apply_overrides`: ``section.field=value`` strings (``--set``), typed by the field;
* :func:`apply_flags`: command-line flags that stand for fields (``--dim`` for ``model.dim``);
* :func:`update_config` / :func:`config_from_dict`: a (partial) mapping, e.g. a config file
  (a field a config no longer has is accepted at the value that meant "off", listed in the
  class's ``RETIRED``, so configs saved before still load);
* :func:`config_to_dict` / :func:`config_to_json`: the config as saved beside an artifact;
* :func:`load_config_file`: a ``.json``, ``.yaml`` or ``.yml`` file as a mapping.

This module imports nothing from :mod:`retrieval`, no TensorFlow, and YAML only to read a
file: tools check their whole configuration with it before loading anything heavy, and a
client-only install (no YAML) names its flags with it.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Opt:
    ...     kind: Literal["adam", "sgd"] = "adam"
    ...     lr: Annotated[float, Range(0, low_open=True)] = 1e-3
    ...     def __post_init__(self) -> None:
    ...         check_fields(self)
    >>> apply_overrides(Opt(), ["kind=sgd", "lr=0.1"])
    Opt(kind='sgd', lr=0.1)
    >>> apply_overrides(Opt(), ["kind=rmsprop"])
    Traceback (most recent call last):
    retrieval.config.FieldError: kind: unknown kind 'rmsprop'; expected one of adam, sgd
    >>> apply_flags(Opt(), {"lr": -1.0}, {"lr": "lr"})
    Traceback (most recent call last):
    retrieval.config.FieldError: --lr -1.0: must be > 0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

__all__ = [
    "CONFIG_SUFFIXES",
    "SEEDS",
    "FieldError",
    "NonNegativeFloat",
    "NonNegativeInt",
    "PositiveFloat",
    "PositiveInt",
    "Range",
    "Seed",
    "Share",
    "apply_flags",
    "apply_overrides",
    "check_fields",
    "config_from_dict",
    "config_to_dict",
    "config_to_json",
    "field_ranges",
    "flag_of",
    "load_config_file",
    "ranged",
    "update_config",
]

C = TypeVar("C")
"""A config dataclass type."""
N = TypeVar("N", int, float)
"""A number's type."""

NULLS = ("none", "null")
"""Override values that mean ``None`` for a field that allows it."""

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
"""Config files :func:`load_config_file` reads."""


@dataclass(frozen=True)
class Range:
    """The numbers a field may take: from ``low`` to ``high`` (``None``: no bound), each end
    included unless ``low_open``/``high_open`` says it is not; never NaN or infinite.

    Declared once, beside its field (``dropout: Annotated[float, Range(0, 1, high_open=True)]``),
    and checked by :func:`check_fields` when the config is built.

    Example:
        >>> str(Range(0, 1, high_open=True)), str(Range(1)), str(Range(0, low_open=True))
        ('in [0, 1)', '>= 1', '> 0')
        >>> 0.5 in Range(0, 1), 1 in Range(0, 1, high_open=True), float("inf") in Range(0)
        (True, False, False)
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.high_open and value == self.high))

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return (
                f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"
            )
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high}"
        return "a finite number"


PositiveInt = Annotated[int, Range(1)]
"""Sizes, counts, budgets: ``>= 1``."""
NonNegativeInt = Annotated[int, Range(0)]
"""Counts where 0 means none or off: ``>= 0``."""
PositiveFloat = Annotated[float, Range(0, low_open=True)]
"""Rates and temperatures: ``> 0``."""
NonNegativeFloat = Annotated[float, Range(0)]
"""Weights where 0 means off: ``>= 0``."""
Share = Annotated[float, Range(0, 1)]
"""A share of something, 0 and 1 included."""
SEEDS = Range(0, 2**32 - 1)
"""The seeds NumPy's legacy seeding (``keras.utils.set_random_seed``) takes."""
Seed = Annotated[int, SEEDS]
"""A seed (a field's, and with :func:`ranged` a flag's)."""


def ranged(kind: Callable[[str], N], allowed: Range) -> Callable[[str], N]:
    """An argparse ``type`` for a numeric flag that stands for no config field: the text read as
    ``kind``, refused outside ``allowed`` (``argument --k: must be >= 1, got 0``).

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> parser.add_argument("--k", type=ranged(int, Range(1)), default=10)  # doctest: +ELLIPSIS
        _StoreAction(...)
    """

    def parse(text: str) -> N:
        value = kind(text)  # text that is no number: argparse's own "invalid int value"
        if value not in allowed:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


class FieldError(ValueError):
    """A field's value outside its choices or its range.

    The message starts with the name the value was given under: ``ModelConfig.dim`` when a
    config is built directly, the key of an override or a file (``model.dim=0: must be >= 1``),
    the flag of a command line (``--dim 0: must be >= 1``), as :meth:`named` renames it.

    Attributes:
        field: the field's name in its dataclass (``dim``).
        value: the value refused.
        expected: what the field takes: a :class:`Range`, or the tuple of its choices.
    """

    def __init__(self, field: str, value: Any, expected: Range | tuple[Any, ...], name: str) -> None:
        self.field, self.value, self.expected = field, value, expected
        if isinstance(expected, Range):
            given = f"{name} {value}" if name.startswith("-") else f"{name}={value}"
            message = f"{given}: must be {'' if math.isfinite(value) else 'finite and '}{expected}"
        else:
            message = (
                f"{name}: unknown {field.replace('_', ' ')} {value!r}; expected one of {_choices(expected)}"
            )
        super().__init__(message)

    def named(self, name: str) -> FieldError:
        """The same error, its value given as ``name`` (a key such as ``train.epochs``, a flag)."""
        return FieldError(self.field, self.value, self.expected, name)


_FIELD_TYPES: dict[type, dict[str, Any]] = {}
_FIELD_RANGES: dict[type, dict[str, Range]] = {}


def field_types(cls: type) -> dict[str, Any]:
    """Field name -> its resolved annotation (string annotations evaluated in the class's module,
    ``Annotated`` extras such as a :class:`Range` left out)."""
    if cls not in _FIELD_TYPES:
        hints = typing.get_type_hints(cls)
        _FIELD_TYPES[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _FIELD_TYPES[cls]


def field_ranges(cls: type) -> dict[str, Range]:
    """Field name -> the :class:`Range` declared beside it, for the fields that declare one
    (``Annotated[int, Range(1)]``, optional or not)."""
    if cls not in _FIELD_RANGES:
        hints = typing.get_type_hints(cls, include_extras=True)
        _FIELD_RANGES[cls] = {}
        for f in dataclasses.fields(cls):
            for annotation in (hints[f.name], *typing.get_args(hints[f.name])):
                if typing.get_origin(annotation) is Annotated:
                    found = [m for m in annotation.__metadata__ if isinstance(m, Range)]
                    _FIELD_RANGES[cls].update({f.name: found[0]} if found else {})
    return _FIELD_RANGES[cls]


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


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _is_texts(annotation: Any) -> bool:
    """Whether ``annotation`` is ``tuple[str, ...]``."""
    return typing.get_origin(annotation) is tuple and typing.get_args(annotation) == (str, ...)


def _is_mapping(annotation: Any) -> bool:
    members, _ = _members(annotation)
    return len(members) == 1 and typing.get_origin(members[0]) in (dict, Mapping)


def check_fields(config: Any) -> None:
    """Checks every ``Literal`` field of a config dataclass against its values and every field
    with a :class:`Range` against it (``None`` passes where the field allows it); call it from
    ``__post_init__``.

    Raises:
        FieldError: names the field (``ModelConfig.dim``), the value given and the valid values.
    """
    cls = type(config)
    ranges = field_ranges(cls)
    for field, annotation in field_types(cls).items():
        value = getattr(config, field)
        if value is None and _members(annotation)[1]:
            continue
        values = literal_values(annotation)
        if values is not None and value not in values:
            raise FieldError(field, value, values, f"{cls.__name__}.{field}")
        if field in ranges and value not in ranges[field]:
            raise FieldError(field, value, ranges[field], f"{cls.__name__}.{field}")


def parse_value(raw: str, annotation: Any, key: str) -> Any:
    """Text (an override's value) as the type ``annotation`` says.

    ``none``/``null`` is ``None`` where the field allows it; ``bool`` takes true/false/1/0;
    a ``Literal`` field the value its text names (text naming none is kept, for
    :func:`check_fields` to refuse); a ``dict`` field a JSON object; a ``tuple[str, ...]``
    field a JSON list of strings, or text split at commas (``a,b``; empty: none).

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
    if values is not None:  # the value its text names; other text is refused by check_fields
        return next((v for v in values if str(v) == raw), raw)
    if target is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{key}: expected true/false, got {raw!r}")
        return raw.lower() in ("true", "1")
    if target in (int, float, str):
        try:
            return target(raw)
        except ValueError:
            raise ValueError(f"{key}: expected {target.__name__}, got {raw!r}") from None
    if _is_texts(target):
        if not raw.startswith("["):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        try:
            texts = json.loads(raw)
        except json.JSONDecodeError:
            texts = None
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"{key}: expected a JSON list of strings, got {raw!r}")
        return tuple(texts)
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
    try:
        return dataclasses.replace(config, **{name: value})
    except FieldError as e:
        raise e.named(path) from None


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
            value of the wrong type.
        FieldError: a value outside its ``Literal``'s values (listed) or its range, named by its key.
    """
    form = "section.field=value" if _has_sections(type(config)) else "field=value"
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = [p.strip() for p in key.split(".")]
        if not sep or not all(parts):
            raise ValueError(f"override {item!r} is not of the form {form}")
        config = _override(config, parts, raw.strip(), item, "")
    return config


def apply_flags(config: C, values: Mapping[str, Any], fields: Mapping[str, str]) -> C:
    """``config`` with the command-line flags that stand for its fields applied in order.

    ``values`` are the parsed arguments (``vars(args)``: argparse's dest -> value, ``None`` for
    a flag not given, which changes nothing), ``fields`` the dest of each flag -> the key it
    sets (``{"dim": "model.dim", "lr": "train.learning_rate"}``); the flag of dest ``batch_size``
    is ``--batch-size``.

    Raises:
        FieldError: a value outside its field's choices or range, named by the flag as typed
            (``--dim 0: must be >= 1``).
    """
    for dest, key in fields.items():
        if values[dest] is None:
            continue
        try:
            config = apply_overrides(config, [f"{key}={values[dest]}"])
        except FieldError as e:
            raise e.named(flag_of(dest)) from None
    return config


def flag_of(dest: str) -> str:
    """The flag argparse stores as ``dest``: ``batch_size`` -> ``--batch-size``."""
    return "--" + dest.replace("_", "-")


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
    if values is not None:  # check_fields refuses a value outside them
        return value
    if isinstance(value, str) and target is not str:
        return parse_value(value, annotation, key)
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
    texts = target is not None and _is_texts(target) and isinstance(value, list | tuple)
    if texts and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError(f"{key}: expected {getattr(target, '__name__', annotation)}, got {value!r}")


def update_config(config: C, payload: Mapping[str, Any], prefix: str = "") -> C:
    """``config`` with the values of ``payload`` (a mapping shaped like :func:`config_to_dict`'s,
    possibly partial: sections and fields left out keep their values).

    Raises:
        ValueError: an unknown key (the message lists the valid ones) or a value of the wrong type.
        FieldError: a value outside its choices or range, named by its key (``train.epochs=0``).
    """
    where = prefix[:-1] or _label(type(config))
    if not isinstance(payload, Mapping):
        raise ValueError(f"{where}: expected a mapping of fields, got {payload!r}")
    types_ = field_types(type(config))
    payload = _without_retired(type(config), payload, prefix)
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
    try:
        return dataclasses.replace(config, **changes)  # type: ignore[type-var]
    except FieldError as e:
        raise e.named(prefix + e.field) from None


def _without_retired(cls: type, payload: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    """``payload`` without the fields ``cls`` no longer has (``cls.RETIRED``: name -> the value
    that left things as they are now), each at that value.

    Raises:
        ValueError: a retired field at another value: what it asked for no longer exists.
    """
    retired: Mapping[str, Any] = getattr(cls, "RETIRED", {})
    for name in retired.keys() & payload.keys():
        if payload[name] != retired[name]:
            raise ValueError(
                f"{prefix}{name}={payload[name]!r}: this setting was removed; only "
                f"{retired[name]!r}, what every run does now, is accepted (remove the key)"
            )
    return {k: v for k, v in payload.items() if k not in retired}


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
    import yaml  # here: a client-only install has none, and reads no config file

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
