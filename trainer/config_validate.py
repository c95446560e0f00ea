"""The config validator: ONE generic walk over dataclass sections (keys, types, ranges).

Constraints live next to each field as ``dataclasses.field`` metadata (:func:`_opt` keeps the
class bodies one line per key), and :func:`validate` / :func:`_build` walk the dataclasses, so a
new section (say ``quantize``) gets key, type and range checking just by adding a
dataclass-typed field to :class:`trainer.config.Config`. Nothing here knows the sections.

Field metadata keys understood by the validator:

``choices``         tuple of allowed values
``prefix_choices``  tuple of allowed string prefixes, each followed by a non-empty rest
                    (e.g. ``"npz:"`` for ``npz:<path>``)
``min`` / ``max``   numeric bounds, inclusive unless ``min_exclusive`` / ``max_exclusive``
``min_len``         minimum length of a list
``items``           a metadata dict applied to every element of a list

A section dataclass may define ``_cross_check(self, path: str) -> None`` for checks that
involve several of its fields; it runs after the fields themselves are valid.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import field
from typing import Any, Mapping, Sequence, Union

from edge_sdk.errors import ConfigError

__all__ = ["validate"]

_META_KEYS = frozenset(
    {"choices", "prefix_choices", "min", "max", "min_exclusive", "max_exclusive", "min_len", "items"}
)


def _opt(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **meta: Any) -> Any:
    """A dataclass field with validator metadata (keeps the class bodies one line per key)."""
    unknown = set(meta) - _META_KEYS
    if unknown:  # a typo here would silently disable a check
        raise TypeError(f"unknown field metadata {sorted(unknown)}; known: {sorted(_META_KEYS)}")
    return field(default=default, default_factory=factory, metadata=meta)


_NoneType = type(None)
# YAML 1.1 (PyYAML) reads 1e-3 as the *string* "1e-3" (it wants a dot and a signed
# exponent). Accept exactly that form for float fields so `lr: 1e-3` and `train.lr=1e-4`
# mean what everyone expects; any other string stays a type error.
_EXP_FLOAT = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)[eE][-+]?\d+")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _optional_args(tp: Any) -> tuple[Any, ...] | None:
    """Non-None members of a Union type, or None when tp is not a Union."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return tuple(a for a in typing.get_args(tp) if a is not _NoneType)
    return None


def _type_name(tp: Any) -> str:
    args = _optional_args(tp)
    if args is not None:
        names = " or ".join(_type_name(a) for a in args)
        return f"{names} or null" if _NoneType in typing.get_args(tp) else names
    origin = typing.get_origin(tp)
    if origin is list:
        (elem,) = typing.get_args(tp) or (Any,)
        return f"list of {_type_name(elem)}"
    if tp is dict or origin is dict:
        return "mapping"
    if tp is Any:
        return "any plain value"
    if _is_section(tp):
        return "mapping (section)"
    return getattr(tp, "__name__", str(tp))


def _value_desc(value: Any) -> str:
    kind = {type(None): "null", dict: "mapping"}.get(type(value), type(value).__name__)
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{kind} {text}"


def _type_error(key: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{key}: expected {expected}, got {_value_desc(value)}")


def _plain(value: Any, key: str) -> Any:
    """Deep copy of a YAML-safe value (None, bool, int, float, str, list, str-keyed dict)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_plain(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{key}: mapping keys must be strings, got {_value_desc(k)}")
            out[k] = _plain(v, _join(key, k))
        return out
    # tuples, numpy scalars, objects: not representable by yaml.safe_dump / weights_only load
    raise _type_error(key, "plain YAML value (null, bool, number, string, list, mapping)", value)


def _check_type(value: Any, tp: Any, key: str, expected: str | None = None) -> Any:
    """Return value (converted int->float, deep-copied) if it has type tp, else ConfigError."""
    expected = expected or _type_name(tp)
    members = _optional_args(tp)
    if members is not None:
        if value is None:
            if _NoneType in typing.get_args(tp):
                return None
            raise _type_error(key, expected, value)
        if len(members) == 1:
            return _check_type(value, members[0], key, expected)
        for member in members:
            try:
                return _check_type(value, member, key)
            except ConfigError:
                continue
        raise _type_error(key, expected, value)
    origin = typing.get_origin(tp)
    if tp is Any:
        return _plain(value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):  # True is not an epoch count
            return value
    elif tp is float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str) and _EXP_FLOAT.fullmatch(value.strip()):
            number = float(value)
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"{key}: expected a finite number, got {_value_desc(value)}")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        if isinstance(value, list):
            (elem,) = typing.get_args(tp) or (Any,)
            return [_check_type(v, elem, f"{key}[{i}]") for i, v in enumerate(value)]
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return _plain(value, key)
    else:
        raise TypeError(f"config field {key}: unsupported annotation {tp!r}")
    raise _type_error(key, expected, value)


def _range_text(meta: Mapping[str, Any]) -> str:
    parts = []
    if meta.get("min") is not None:
        parts.append(f"{'>' if meta.get('min_exclusive') else '>='} {meta['min']}")
    if meta.get("max") is not None:
        parts.append(f"{'<' if meta.get('max_exclusive') else '<='} {meta['max']}")
    return " and ".join(parts)


def _check_constraints(value: Any, meta: Mapping[str, Any], key: str) -> None:
    if value is None:  # only reachable for Optional fields; null means "off"
        return
    choices = meta.get("choices")
    prefixes = meta.get("prefix_choices", ())
    if choices is not None or prefixes:
        ok = value in (choices or ()) or any(
            isinstance(value, str) and value.startswith(p) and len(value) > len(p) for p in prefixes
        )
        if not ok:
            allowed = [str(c) for c in (choices or ())] + [f"{p}<path>" for p in prefixes]
            raise ConfigError(f"{key}: must be one of {', '.join(allowed)}; got {value!r}")
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None or hi is not None:
        too_low = lo is not None and (value <= lo if meta.get("min_exclusive") else value < lo)
        too_high = hi is not None and (value >= hi if meta.get("max_exclusive") else value > hi)
        if too_low or too_high:
            raise ConfigError(f"{key}: must be {_range_text(meta)}; got {value!r}")
    if "min_len" in meta and len(value) < meta["min_len"]:
        raise ConfigError(f"{key}: needs at least {meta['min_len']} element(s); got {value!r}")
    if "items" in meta:
        for i, item in enumerate(value):
            _check_constraints(item, meta["items"], f"{key}[{i}]")


def _unknown_key(path: str, key: Any, allowed: Sequence[str]) -> ConfigError:
    msg = f"unknown config key '{_join(path, str(key))}'"
    close = difflib.get_close_matches(str(key), list(allowed), n=1)
    if close:
        msg += f"; did you mean '{_join(path, close[0])}'?"
    where = f"section '{path}'" if path else "the top level"
    return ConfigError(f"{msg} (allowed keys in {where}: {', '.join(sorted(allowed))})")


def _field_default(f: dataclasses.Field, key: str) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise ConfigError(f"missing required config key '{key}'")


def _build(cls: type, data: Any, path: str) -> Any:
    """Validated instance of section class cls from a mapping (missing keys -> defaults)."""
    if data is None:  # an empty section (`train:` with nothing under it) means "all defaults"
        data = {}
    if not isinstance(data, Mapping):
        where = f"section '{path}'" if path else "the config"
        raise ConfigError(f"{where} must be a mapping of keys, got {_value_desc(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            raise _unknown_key(path, key, list(fields))
    values = {}
    for name, f in fields.items():
        key = _join(path, name)
        raw = data[name] if name in data else _field_default(f, key)
        tp = hints[name]
        section = _section_type(tp)
        if section is not None:
            if raw is None and _optional_args(tp) is not None:
                values[name] = None  # an optional section switched off
                continue
            if isinstance(raw, section):  # a default_factory instance
                raw = dataclasses.asdict(raw)
            values[name] = _build(section, raw, key)
        else:
            value = _check_type(raw, tp, key)
            _check_constraints(value, f.metadata, key)
            values[name] = value
    obj = cls(**values)
    cross_check = getattr(obj, "_cross_check", None)
    if cross_check is not None:
        cross_check(path)
    return obj


def _section_type(tp: Any) -> type | None:
    """The dataclass behind a field type (plain or Optional), or None for a value field."""
    if _is_section(tp):
        return tp
    members = _optional_args(tp)
    if members is not None and len(members) == 1 and _is_section(members[0]):
        return members[0]
    return None


def validate(obj: Any, path: str = "") -> Any:
    """Validated copy of a config dataclass (any section); ConfigError names the bad key.

    ``path`` prefixes key names in messages, e.g. ``validate(cfg.data, "data")``.
    """
    if not _is_section(type(obj)):
        raise TypeError(f"validate() expects a config dataclass instance, got {type(obj).__name__}")
    return _build(type(obj), dataclasses.asdict(obj), path)
