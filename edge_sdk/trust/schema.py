"""The bundle manifest as a JSON Schema, generated from the schema dataclasses of
:mod:`edge_sdk.bundle`, for apps that read ``manifest.yaml`` in another language.

    python -m edge_sdk.trust.schema                 # writes docs/manifest.schema.json (checkout)
    python -m edge_sdk.trust.schema --check         # exit 1 if the committed file is stale
    python -m edge_sdk.trust.schema --out -         # print it

:func:`manifest_json_schema` walks the fields of :class:`~edge_sdk.bundle.Manifest` and the
records it holds (:class:`~edge_sdk.bundle.InputSpec`, :class:`~edge_sdk.bundle.Configuration`,
:class:`~edge_sdk.bundle.FileEntry`, :class:`~edge_sdk.bundle.OutputSpec`): every key, its type
(from the annotation), whether it is required (no default) and its default come from the
dataclasses, so a field added, removed or retyped there changes the schema. What an annotation
cannot say (allowed values, bounds, patterns) is added from :data:`CONSTRAINTS`, which names the
bundle module's own constants (``SCOPES``, ``WEIGHT_ROUTES``, ...) and may only name fields that
exist. Rules that relate several fields (a configuration's file count against its scope and
samples, output rows against samples, one output class per label, unique ids) are checked by
:func:`edge_sdk.bundle.read_manifest` and stated in the descriptions, not in the schema.

:func:`validate` checks a value against the subset of JSON Schema (2020-12) emitted here
(:mod:`edge_sdk.trust.schema_check`), so the schema can be exercised without a third-party
validator; it refuses keywords outside that subset rather than ignoring them.

stdlib only, like the rest of the device package.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Union

from edge_sdk.bundle.configuration import Configuration
from edge_sdk.bundle.input_spec import InputSpec
from edge_sdk.bundle.manifest import Manifest
from edge_sdk.bundle.preprocess import Preprocess
from edge_sdk.bundle.records import SCHEMA_VERSION, FileEntry, OutputSpec, Recipe, Slice, StoreEntry
from edge_sdk.bundle.stats import InputStats
from edge_sdk.trust.schema_check import check
from edge_sdk.trust.schema_fields import CONSTRAINTS

__all__ = ["CONSTRAINTS", "RECORDS", "SCHEMA_PATH", "manifest_json_schema", "schema_text",
           "validate"]

_CHECKOUT = Path(__file__).resolve().parents[2]
#: The default output: the committed copy in a source checkout; installed from a wheel (no
#: checkout around it), ``manifest.schema.json`` in the working directory.
SCHEMA_PATH = _CHECKOUT / "docs" / "manifest.schema.json" \
    if (_CHECKOUT / "pyproject.toml").is_file() else Path("manifest.schema.json")
RECORDS: tuple[type, ...] = (Manifest, InputSpec, OutputSpec, FileEntry,
                             Configuration, StoreEntry, Recipe, Slice, InputStats, Preprocess)

def _type_schema(tp: Any) -> dict[str, Any]:
    """The schema of one annotation (the subset the bundle dataclasses use)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return {}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # (a class, never an instance)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        inner = _type_schema(options[0]) if len(options) == 1 else \
            {"anyOf": [_type_schema(a) for a in options]}
        if type(None) not in args:
            return inner
        if set(inner) == {"type"}:  # a plain type: ["number", "null"]
            return {"type": [inner["type"], "null"]}
        return {"anyOf": [inner, {"type": "null"}]}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type_schema(args[0])}
        if args and len(set(args)) == 1:
            return {"type": "array", "items": _type_schema(args[0]),
                    "minItems": len(args), "maxItems": len(args)}
        if args:  # a fixed-length tuple of mixed types: each position its own schema
            return {"type": "array", "prefixItems": [_type_schema(a) for a in args],
                    "items": False, "minItems": len(args), "maxItems": len(args)}
    if origin is dict and args and args[0] is str:
        value = _type_schema(args[1])
        return {"type": "object", **({"additionalProperties": value} if value else {})}
    raise TypeError(f"no JSON Schema for the annotation {tp!r}; extend _type_schema")


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if key == "required":
            continue
        if key == "items" and isinstance(out.get("items"), dict) and "anyOf" not in value:
            out["items"] = {**out["items"], **value}
        else:
            out[key] = value
    return out


def _plain_default(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _manifest_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields a manifest holds: all but those marked ``metadata={"manifest": False}``
    (e.g. the class names an input spec carries in a checkpoint, not in a manifest)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("manifest", True)]


def _record_schema(cls: type) -> dict[str, Any]:
    # the records by name: a module may import the class of a field only where it parses it
    hints = typing.get_type_hints(cls, localns={r.__name__: r for r in RECORDS})
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in _manifest_fields(cls):
        extra = CONSTRAINTS.get(f"{cls.__name__}.{f.name}", {})
        prop = _merge(_type_schema(hints[f.name]), extra)
        if f.default is not dataclasses.MISSING:
            prop["default"] = _plain_default(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            prop["default"] = _plain_default(f.default_factory())
        if ("default" not in prop and extra.get("required") is not False) \
                or extra.get("required"):
            required.append(f.name)
        properties[f.name] = prop
    first_paragraph = (cls.__doc__ or "").strip().split("\n\n")[0]
    doc = " ".join(first_paragraph.split()).replace("``", "`")
    return {"type": "object", "description": doc, "properties": properties,
            "required": required, "additionalProperties": False}


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``manifest.yaml``, from the bundle dataclasses."""
    known = {f"{c.__name__}.{f.name}" for c in RECORDS for f in _manifest_fields(c)}
    unknown = sorted(set(CONSTRAINTS) - known)
    if unknown:
        raise KeyError(f"CONSTRAINTS names fields the dataclasses do not have: {unknown}")
    top = _record_schema(Manifest)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://edge-sdk/manifest.schema.v{SCHEMA_VERSION}.json",
        "title": f"edge-sdk bundle manifest (manifest.yaml), schema version {SCHEMA_VERSION}",
        "$comment": "Generated by `python -m edge_sdk.trust.schema` from the dataclasses in "
                    "edge_sdk/bundle/; do not edit. Cross-field rules (files and invokes per "
                    "scope and samples, output rows per scope, one output class per label, "
                    "unique configuration ids, cascade targets wider and of the same scope) are "
                    "checked by edge_sdk.bundle.read_manifest.",
        **top,
        "$defs": {cls.__name__: _record_schema(cls) for cls in RECORDS
                  if cls is not Manifest},
    }


def schema_text() -> str:
    """The committed file's exact text."""
    return json.dumps(manifest_json_schema(), indent=2, ensure_ascii=True) + "\n"


def validate(instance: Any, schema: dict[str, Any] | None = None) -> list[str]:
    """The problems of ``instance`` against ``schema`` (default: :func:`manifest_json_schema`),
    one ``path: message`` per problem; empty when it is valid (:func:`edge_sdk.trust.schema_check.check`)."""
    return check(instance, manifest_json_schema() if schema is None else schema, "manifest")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m edge_sdk.trust.schema",
        description="Write the manifest's JSON Schema, generated from edge_sdk/bundle/.")
    p.add_argument("--out", default=str(SCHEMA_PATH),
                   help=f"file to write, '-' for stdout (default {SCHEMA_PATH})")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if --out differs from the generated schema")
    args = p.parse_args(argv)
    text = schema_text()
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    if args.check:
        current = out.read_text() if out.is_file() else None
        if current != text:
            print(f"{out} is stale: regenerate it with python -m edge_sdk.trust.schema",
                  file=sys.stderr)
            return 1
        print(f"{out} is up to date")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
