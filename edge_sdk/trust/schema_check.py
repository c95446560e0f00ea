"""A validator for the subset of JSON Schema (2020-12) that :mod:`edge_sdk.trust.schema`
emits: enough to exercise the manifest's schema in the tests without a third-party validator.
It refuses a keyword outside that subset instead of ignoring it, so a schema that grows a
keyword fails loudly here until the check is written. stdlib only, like the rest of the
device package.
"""
from __future__ import annotations

import re
from typing import Any

__all__ = ["check"]

# keywords the generator emits and check() implements; anything else is refused
_ANNOTATIONS = {"$schema", "$id", "title", "description", "default", "$comment", "$defs"}
_KEYWORDS = {"$ref", "type", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
             "minLength", "pattern", "minItems", "maxItems", "uniqueItems", "items",
             "prefixItems", "properties", "required", "additionalProperties", "propertyNames",
             "anyOf"}

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, (list, tuple)),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    same: bool = a == b
    return same


def check(instance: Any, schema: dict[str, Any], path: str = "value") -> list[str]:
    """The problems of ``instance`` against ``schema``, one ``path: message`` per problem
    (``path`` names the root); empty when it is valid. Raises ``ValueError`` when the schema
    uses a keyword outside the subset this module implements."""
    errors: list[str] = []
    _check(instance, schema, schema, path, errors)
    return errors


def _check(v: Any, s: dict[str, Any], root: dict[str, Any], path: str, errors: list[str]) -> None:
    unknown = set(s) - _KEYWORDS - _ANNOTATIONS
    if unknown:
        raise ValueError(f"schema at {path} uses keywords this validator does not implement: "
                         f"{sorted(unknown)}")
    if "$ref" in s:
        ref = s["$ref"]
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"only local #/$defs/ references are supported, got {ref!r}")
        _check(v, root["$defs"][ref[len("#/$defs/"):]], root, path, errors)
    if "anyOf" in s:
        if not any(not _probe(v, sub, root, path) for sub in s["anyOf"]):
            errors.append(f"{path}: matches none of the allowed forms")
    if "type" in s:
        allowed = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_TYPES[t](v) for t in allowed):
            errors.append(f"{path}: expected {' or '.join(allowed)}, got {type(v).__name__} "
                          f"{v!r:.60}")
            return
    if "const" in s and not _equal(v, s["const"]):
        errors.append(f"{path}: expected {s['const']!r}, got {v!r:.60}")
    if "enum" in s and not any(_equal(v, e) for e in s["enum"]):
        errors.append(f"{path}: expected one of {s['enum']}, got {v!r:.60}")
    if _TYPES["number"](v):
        if "minimum" in s and v < s["minimum"]:
            errors.append(f"{path}: expected >= {s['minimum']}, got {v!r}")
        if "maximum" in s and v > s["maximum"]:
            errors.append(f"{path}: expected <= {s['maximum']}, got {v!r}")
        if "exclusiveMinimum" in s and not v > s["exclusiveMinimum"]:
            errors.append(f"{path}: expected > {s['exclusiveMinimum']}, got {v!r}")
    if isinstance(v, str):
        if "minLength" in s and len(v) < s["minLength"]:
            errors.append(f"{path}: expected at least {s['minLength']} character(s)")
        if "pattern" in s and not re.search(s["pattern"], v):
            errors.append(f"{path}: {v!r:.60} does not match {s['pattern']}")
    if isinstance(v, (list, tuple)):
        if "minItems" in s and len(v) < s["minItems"]:
            errors.append(f"{path}: expected at least {s['minItems']} item(s), got {len(v)}")
        if "maxItems" in s and len(v) > s["maxItems"]:
            errors.append(f"{path}: expected at most {s['maxItems']} item(s), got {len(v)}")
        if s.get("uniqueItems") and any(_equal(a, b) for i, a in enumerate(v)
                                        for b in v[i + 1:]):
            errors.append(f"{path}: expected unique items")
        prefix = s.get("prefixItems", [])
        for i, item in enumerate(v):
            sub = prefix[i] if i < len(prefix) else s.get("items")
            if sub is not None:
                _check(item, sub, root, f"{path}[{i}]", errors)
    if isinstance(v, dict):
        props = s.get("properties", {})
        for key in s.get("required", []):
            if key not in v:
                errors.append(f"{path}.{key}: missing required key")
        for key, item in v.items():
            if "propertyNames" in s:
                _check(key, s["propertyNames"], root, f"{path} key {key!r}", errors)
            if key in props:
                _check(item, props[key], root, f"{path}.{key}", errors)
            elif s.get("additionalProperties") is False:
                errors.append(f"{path}: unknown key {key!r}")
            elif isinstance(s.get("additionalProperties"), dict):
                _check(item, s["additionalProperties"], root, f"{path}.{key}", errors)


def _probe(v: Any, s: dict[str, Any], root: dict[str, Any], path: str) -> list[str]:
    found: list[str] = []
    _check(v, s, root, path, found)
    return found
