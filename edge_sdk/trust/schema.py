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
from edge_sdk.bundle.records import BUNDLE_LAYOUTS, FileEntry, INPUT_DTYPES, LAYOUTS, OUTPUT_KINDS, OutputSpec, Recipe, SCHEMA_VERSION, SCOPES, Slice, StoreEntry, WEIGHT_ROUTES
from edge_sdk.bundle.stats import InputStats
from edge_sdk.trust.schema_check import check

__all__ = ["CONSTRAINTS", "RECORDS", "SCHEMA_PATH", "manifest_json_schema", "schema_text",
           "validate"]

_CHECKOUT = Path(__file__).resolve().parents[2]
#: The default output: the committed copy in a source checkout; installed from a wheel (no
#: checkout around it), ``manifest.schema.json`` in the working directory.
SCHEMA_PATH = _CHECKOUT / "docs" / "manifest.schema.json" \
    if (_CHECKOUT / "pyproject.toml").is_file() else Path("manifest.schema.json")
RECORDS: tuple[type, ...] = (Manifest, InputSpec, OutputSpec, FileEntry,
                             Configuration, StoreEntry, Recipe, Slice, InputStats)

_PROBABILITY = {"type": ["number", "null"], "minimum": 0, "maximum": 1}

#: Per ``Record.field``: what the annotation cannot say (keywords merged into the field's
#: generated schema; ``items`` merges into the generated item schema). A test checks that every
#: key names a real field.
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "Manifest.schema_version": {
        "const": SCHEMA_VERSION, "required": True,
        "description": "The format version; a reader refuses any it does not know (read it "
                       "first). edge_sdk also reads versions 5 (no input_stats), 4 (no uncertainty), 3, 2 (without layout, store, graphs "
                       "and materialize: layout files) and 1 (version 2 without batch_dim)."},
    "Manifest.layout": {
        "enum": list(BUNDLE_LAYOUTS),
        "description": "files: every listed .tflite file is in the bundle directory. store: "
                       "the directory holds one weight store (store) and every file is "
                       "materialised from it by its recipe (docs/store.md)."},
    "Manifest.store": {
        "description": "The weight store file (layout store; null otherwise): verify its size "
                       "and sha256 before decoding it."},
    "Manifest.uncertainty": {
        "description": "Schema version 5 (issue 33), optional: uncertainty.bin, the "
                       "out-of-distribution statistics and conformal quantiles "
                       "(edge_sdk.answers.uncertainty), in the store's container format; verify its "
                       "size and sha256 before decoding it. Absent: answers carry no OOD "
                       "score and no prediction set."},
    "Manifest.input_stats": {
        "description": "Schema version 6 (issue 34), optional: the training split's per-channel "
                       "statistics of the raw input (edge_sdk.inputs.stats): a sample whose "
                       "channel mean or maximum lies outside the training samples' band "
                       "widened by margin is input_suspect. Absent: input_suspect is null."},
    "InputStats.sample_mean": {
        "description": "Per channel [lo, hi]: the 0.1st and 99.9th percentile over training "
                       "samples of the sample's mean of that channel (raw units)."},
    "InputStats.sample_max": {
        "description": "Per channel [lo, hi]: the same for the sample's maximum."},
    "InputStats.margin": {
        "minimum": 0,
        "description": "Raw units each band is widened by on both sides (the exporter: 10 % "
                       "of the value range)."},
    "Manifest.slices": {
        "propertyNames": {"pattern": r"^[^./\\:][^/\\:]*\.tflite$"},
        "description": "Layout store: every virtual file once, by its .tflite name: sha256 and "
                       "bytes of the materialised file and its recipe; configurations list "
                       "their files by these names."},
    "Manifest.graphs": {
        "propertyNames": {"pattern": r"^(0\.[0-9][0-9]|1\.00)$"},
        "additionalProperties": {"anyOf": [
            {"type": "object", "required": ["tensors", "ops", "inputs", "outputs"]},
            {"type": "object", "required": ["base", "shapes"], "additionalProperties": False,
             "properties": {"base": {"type": "string"}, "shapes": {"type": "array"},
                            "options": {"type": "object"}}}]},
        "description": "Layout store: width key ('0.50') -> that width's point graph "
                       "description (edge_sdk.tflite.graph.Graph.to_dict; weights by reference), or "
                       "{base, shapes[, options]}: the graph of width base (written in full) "
                       "with every tensor's shape replaced (tensor order) and the options of "
                       "the op whose first output is each key of options."},
    "Manifest.batch_dim": {
        "enum": [0, None],
        "description": "The slices' batch dimension (0: input [N, H, W, C] after "
                       "resize_tensor_input, output [N * rows, C], rows n*rows..(n+1)*rows-1 "
                       "for sample n), or null: batch 1 only."},
    "Manifest.input": {"description": "What predict accepts, before normalisation."},
    "Manifest.labels": {
        "minItems": 1, "uniqueItems": True, "items": {"minLength": 1},
        "description": "Class names, one per output class, in output order."},
    "Manifest.source": {
        "description": "Free-form provenance (checkpoint, data, export options): plain values."},
    "Manifest.configurations": {
        "minItems": 1,
        "description": "Every runnable (width, scope, samples); ids unique."},
    "InputSpec.shape": {
        "minItems": 4, "maxItems": 4, "prefixItems": [{"const": 1}], "items": {"minimum": 1},
        "description": "[1, H, W, C]: one sample (NHWC), the slices' input as written; "
                       "batch_dim says whether it resizes to [N, H, W, C]."},
    "InputSpec.layout": {"enum": list(LAYOUTS)},
    "InputSpec.dtype": {"enum": list(INPUT_DTYPES)},
    "InputSpec.value_range": {
        "minItems": 2, "maxItems": 2,
        "description": "[lo, hi], lo < hi: the raw values predict accepts (before "
                       "normalisation); an image's 0..255 pixels map linearly onto it."},
    "InputSpec.mean": {
        "minItems": 1,
        "description": "Per channel (C values): model input = (raw - mean) / std."},
    "InputSpec.std": {"minItems": 1, "items": {"exclusiveMinimum": 0},
                      "description": "Per channel (C values), > 0."},
    "OutputSpec.kind": {
        "enum": list(OUTPUT_KINDS),
        "description": "logits: the softmax is the reader's, at the configuration's "
                       "temperature."},
    "OutputSpec.shape": {
        "minItems": 2, "maxItems": 2, "items": {"minimum": 1},
        "description": "[rows, classes] per invoke: [1, C] for point and all, [S, C] for head "
                       "(S = samples); C = the number of labels."},
    "FileEntry.name": {
        "pattern": r"^[^./\\:][^/\\:]*\.tflite$",
        "description": "A .tflite file directly inside the bundle directory."},
    "FileEntry.sha256": {"pattern": "^[0-9a-f]{64}$",
                         "description": "Lowercase hex; check it before use."},
    "FileEntry.bytes": {"minimum": 1},
    "Configuration.id": {"minLength": 1},
    "Configuration.width": {"exclusiveMinimum": 0, "maximum": 1, "required": False,
                            "description": "Fraction of every nested layer's channels kept. "
                                           "Required unless the files are slice names (layout "
                                           "store): then left out = its first slice's width."},
    "Configuration.scope": {
        "enum": list(SCOPES), "required": False,
        "description": "point: the posterior mean, one file, one invoke. head: point backbone "
                       "with S sampled classifiers in one graph, one file, output [S, C]. "
                       "all: S fully sampled networks, S files, one invoke each, [1, C] each. "
                       "Files listed by slice name: left out = head if the first slice has "
                       "heads, all if it has a sample, else point."},
    "Configuration.samples": {"minimum": 1, "required": False,
                              "description": "Posterior samples S averaged (point: 1). Files "
                                             "listed by slice name: left out = the first "
                                             "slice's heads (head), the number of files (all) "
                                             "or 1."},
    "Configuration.files": {
        # the YAML's form: a parsed Configuration holds FileEntry records only (the names
        # are resolved against the slices table at parse time)
        "items": {"anyOf": [{"$ref": "#/$defs/FileEntry"}, {"type": "string"}]},
        "minItems": 1,
        "description": "One file (point, head) or one per sample (all), in sample order: "
                       "file entries, or (layout store) names of the slices table."},
    "Configuration.invokes": {"minimum": 1, "required": False,
                              "description": "Invokes per prediction: 1, or S for scope all "
                                             "(files listed by slice name: left out = that)."},
    "Configuration.temperature": {
        "exclusiveMinimum": 0,
        "description": "Divide every logit by it before the softmax (fitted on validation)."},
    "Configuration.temperature_folded": {
        "required": False,
        "description": "Whether the files' logits already include 1/temperature (the "
                       "exporter writes false; edge_sdk divides by temperature either way). "
                       "Files listed by slice name: left out = false."},
    "Configuration.weights": {"enum": list(WEIGHT_ROUTES), "required": False,
                              "description": "Files listed by slice name: left out = "
                                             "dequantize."},
    "Configuration.output": {"required": False,
                             "description": "Files listed by slice name: left out = {kind: "
                                            "logits, shape: [S for head else 1, labels]}."},
    "Configuration.macs": {"minimum": 0, "description": "Multiply-accumulates per invoke."},
    "Configuration.params": {"minimum": 0},
    "Configuration.unique_values": {"minimum": 0},
    "Configuration.weight_entropy_bits": {"minimum": 0},
    "Configuration.thresholds": {
        "propertyNames": {"pattern": r"^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$"},
        "additionalProperties": _PROBABILITY,
        "description": "Target accuracy (a string such as '0.95') -> the minimum confidence "
                       "at which answers reach it on validation (null: never); below it "
                       "predict sets abstain."},
    "Configuration.cascade": {
        "additionalProperties": {
            "type": "object", "required": ["threshold", "coverage"],
            "additionalProperties": False,
            "properties": {"threshold": _PROBABILITY,
                           "coverage": {"type": "number", "minimum": 0, "maximum": 1},
                           "max_loss": {"type": "number", "minimum": 0, "maximum": 1,
                                        "default": 0.002}}},
        "description": "Id of a wider configuration of the same scope -> a two-stage plan: "
                       "answer here when confidence >= threshold, else run that one. "
                       "max_loss is required unless the files are slice names (left out: "
                       "0.002)."},
    "Configuration.val_nll": {"minimum": 0,
                              "description": "Validation NLL at the temperature: the budget "
                                             "rule prefers the lowest."},
    "Configuration.test": {
        "description": "Test metrics: {raw: {...}, calibrated: {...}} (accuracy, nll, ece, "
                       "brier, ...), measured through the written files. Files listed by "
                       "slice name: calibrated lists only the metrics that differ from raw."},
    "Configuration.latency_ms": {"minimum": 0,
                                 "description": "Per prediction, on the exporting host."},
    "Configuration.memory_mb": {"minimum": 0,
                                "description": "RSS increase of loading and running it."},
    "Configuration.materialize": {
        "description": "The first version-3 store form: one recipe per file, in file order "
                       "(how the file's bytes are made from the store), with the files as "
                       "entries; still read. Written: the recipes are in slices."},
    "Slice.sha256": {"pattern": "^[0-9a-f]{64}$",
                     "description": "Of the materialised bytes; check it before use."},
    "Slice.bytes": {"minimum": 1},
    "Slice.width": {
        "pattern": r"^(0\.[0-9][0-9]|1\.00)$",
        "description": "A key of graphs: the width the slice is cut to."},
    "Slice.sample": {
        "minimum": 0,
        "description": "The posterior sample (scope all), or null: the point network."},
    "Slice.heads": {
        "minimum": 0,
        "description": "Head scope: S sampled classifiers stacked (output [S, C]); else 0."},
    "StoreEntry.name": {
        "pattern": r"^[^./\\:][^/\\:]*\.bin$",
        "description": "The store file directly inside the bundle directory."},
    "StoreEntry.sha256": {"pattern": "^[0-9a-f]{64}$",
                          "description": "Lowercase hex; check it before decoding."},
    "StoreEntry.bytes": {"minimum": 1},
    "Recipe.width": {
        "pattern": r"^(0\.[0-9][0-9]|1\.00)$",
        "description": "A key of graphs: the width the slice is cut to."},
    "Recipe.sample": {
        "minimum": 0,
        "description": "The posterior sample (scope all), or null: the point network."},
    "Recipe.heads": {
        "minimum": 0,
        "description": "Head scope: S sampled classifiers stacked (output [S, C]); else 0."},
}

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
    hints = typing.get_type_hints(cls)
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
