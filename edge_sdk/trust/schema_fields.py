"""What the manifest's dataclass annotations cannot say, per ``Record.field``: the bounds,
patterns, enums and descriptions that :mod:`edge_sdk.trust.schema` merges into each field's
generated JSON Schema.
"""
from __future__ import annotations

from typing import Any

from edge_sdk.bundle.preprocess import INTERPOLATIONS
from edge_sdk.bundle.records import (BUNDLE_LAYOUTS, INPUT_DTYPES, LAYOUTS, OUTPUT_KINDS,
                                     SCHEMA_VERSION, SCOPES, WEIGHT_ROUTES)

__all__ = ["CONSTRAINTS"]

_PROBABILITY = {"type": ["number", "null"], "minimum": 0, "maximum": 1}

#: Per ``Record.field``: what the annotation cannot say (keywords merged into the field's
#: generated schema; ``items`` merges into the generated item schema). A test checks that every
#: key names a real field.
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "Manifest.schema_version": {
        "const": SCHEMA_VERSION, "required": True,
        "description": "The format version; a reader refuses any it does not know (read it "
                       "first). edge_sdk also reads versions 9 (no val_accuracy), 8 (no "
                       "input.preprocess), 7 (no cascade targets), 6 (no integer slices, no "
                       "activation_quant), 5 (no input_stats), 4 (no uncertainty), 3, 2 "
                       "(without layout, store, graphs and materialize: layout files) and 1 "
                       "(version 2 without batch_dim)."},
    "Manifest.layout": {
        "enum": list(BUNDLE_LAYOUTS),
        "description": "files: every listed .tflite file is in the bundle directory. store: "
                       "the directory holds one weight store (store) and every file is "
                       "materialised from it by its recipe (docs/store.md)."},
    "Manifest.store": {
        "description": "The weight store file (layout store; null otherwise): verify its size "
                       "and sha256 before decoding it."},
    "Manifest.uncertainty": {
        "description": "Schema version 5, optional: uncertainty.bin, the "
                       "out-of-distribution statistics and conformal quantiles "
                       "(edge_sdk.answers.uncertainty), in the store's container format; verify its "
                       "size and sha256 before decoding it. Absent: answers carry no OOD "
                       "score and no prediction set."},
    "Manifest.activation_quant": {
        "propertyNames": {"pattern": r"^(0\.[0-9][0-9]|1\.00)$"},
        "description": "Schema version 7, layout store: width key -> activation tensor -> "
                       "[scale, zero point] of the width's integer slice (weights int8), which "
                       "the device builds from the store's float graph with these "
                       "(edge_sdk.tflite.integer). Absent: no integer slice in the store."},
    "Manifest.input_stats": {
        "description": "Schema version 6, optional: the training split's per-channel "
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
    "InputSpec.preprocess": {
        "description": "Schema version 9, optional (uint8 input only): a photo model's "
                       "evaluation transform, which the runtime applies to image files and "
                       "uint8 H x W x C arrays of any size. Absent: inputs come at shape."},
    "Preprocess.resize": {
        "minimum": 1,
        "description": "The shorter side after resizing, pixels (the longer keeps the aspect "
                       "ratio, int(resize * long / short)); at least the crop's larger side."},
    "Preprocess.crop": {
        "minItems": 2, "maxItems": 2, "items": {"minimum": 1},
        "description": "[H, W] cut from the centre (top = round((h - H) / 2)): the input "
                       "shape's H and W."},
    "Preprocess.interpolation": {
        "enum": list(INTERPOLATIONS),
        "description": "The Pillow resampling filter of the resize."},
    "Preprocess.exif": {
        "description": "Image files are turned upright by their EXIF orientation tag first."},
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
                              "description": "The kernels: dequantize and float run float32 "
                                             "kernels, hybrid int8 weights with activations "
                                             "quantized per invoke, int8 (schema version 7) "
                                             "int8 kernels end to end. Files listed by slice "
                                             "name: left out = dequantize."},
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
                                        "default": 0.002},
                           "targets": {
                               "type": "object",
                               "propertyNames": {
                                   "pattern": r"^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$"},
                               "additionalProperties": {
                                   "type": "object", "required": ["threshold", "coverage"],
                                   "additionalProperties": False,
                                   "properties": {
                                       "threshold": _PROBABILITY,
                                       "coverage": {"type": "number", "minimum": 0,
                                                    "maximum": 1}}}}}},
        "description": "Id of a wider configuration of the same scope -> a two-stage plan: "
                       "answer here when confidence >= threshold, else run that one. "
                       "max_loss is required unless the files are slice names (left out: "
                       "0.002). targets (schema version 8): per target accuracy of the "
                       "cascade's answers, its own threshold and coverage (the accuracy it "
                       "may give up: max(wider's accuracy - target, max_loss))."},
    "Configuration.val_nll": {"minimum": 0,
                              "description": "Validation NLL at the temperature: the budget "
                                             "rule prefers the lowest."},
    "Configuration.val_accuracy": {
        "minimum": 0, "maximum": 1,
        "description": "Schema version 10, optional: the accuracy of the validation "
                       "predictions (the argmax, the same at any temperature), which the "
                       "device rules compare. Null or absent: not recorded (the rules fall "
                       "back to test.raw.accuracy)."},
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
