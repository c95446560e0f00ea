"""The bundle format: a directory holding ``manifest.yaml`` and the ``.tflite`` files it lists.

The exporter writes bundles through :func:`write_bundle`; the runtime reads them with
:func:`read_manifest`. This package owns the schema, so both sides agree on it by construction.
Its modules, in reading order: :mod:`edge_sdk.validation` (the typed checks, shared with the
device profiles), :mod:`.records` (constants, FileEntry, OutputSpec), :mod:`.input_spec`
(InputSpec), :mod:`.preprocess` (a photo model's Preprocess), :mod:`.configuration`
(Configuration), :mod:`.compact` (the store form's compact manifest), :mod:`.manifest`
(Manifest), :mod:`.reading` (parse, resolve, verify),
:mod:`.slices` (the verified bytes interpreters are built from), :mod:`.writing` (atomic write)
and :mod:`.recovery` (one export at a time, and what a killed one left). Import every name from
here: ``from edge_sdk.bundle import Manifest``.

Schema version 4 (``manifest.yaml``; version 3 is the same without the compact store form
of docs/store.md §5; version 2 is version 3 without ``layout``, ``store``,
``graphs`` and ``materialize``, i.e. layout ``files``; version 1 is version 2 without
``batch_dim``, and still reads, as batch-1 slices)::

    schema_version: 4
    input:            # what predict accepts, before normalisation; model input = (raw - mean) / std
      shape: [1, H, W, C]
      layout: NHWC
      dtype: float32 | uint8
      value_range: [lo, hi]
      mean: [C floats]
      std: [C floats, > 0]
      preprocess:     # schema version 9, optional: a photo model's evaluation transform, which
        resize: 146   # the runtime applies to image files and uint8 photos of any size (dtype
        crop: [H, W]  # uint8 only): shorter side -> resize, centre crop [H, W] (= the shape's)
        interpolation: bilinear       # a Pillow filter: nearest, bilinear, bicubic, lanczos, ...
        exif: true                    # files turned upright by their EXIF orientation first
    labels: [class names]             # one per output class; non-empty, unique
    source: {...}                     # free-form provenance (plain YAML values)
    batch_dim: 0                      # the slices' batch dimension: resize_tensor_input(0,
                                      # [N, H, W, C]) runs N samples in one invoke, output
                                      # [N * rows, C]; null (or version 1): batch 1 only
    layout: files | store             # files: the .tflite files are in the directory; store:
                                      # one weight store, every file materialised from it
                                      # (docs/store.md)
    store: {name: store.bin, sha256: <64 hex>, bytes: <int>}   # layout store only
    slices:                           # layout store only: every virtual file once, by name
      w0.50-s0.tflite: {sha256: <64 hex>, bytes: <int>, width: '0.50', sample: 0}
      w0.50-head8.tflite: {sha256: ..., bytes: ..., width: '0.50', heads: 8}
                                      # its recipe: graphs key, sample index (all; omitted:
                                      # null), heads (head scope: S stacked; omitted: 0)
    configurations:                   # non-empty; ids unique
    - id: w0.50-head8
      width: 0.5                      # 0 < width <= 1
      scope: point | head | all
      samples: 8                      # point: 1
      files: [{name: x.tflite, sha256: <64 hex>, bytes: <int>}]   # point/head: 1 file, all: `samples`
                                      # layout store: names of the slices table [w0.50-s0.tflite]
      invokes: 1                      # point/head: 1, all: samples
      output: {kind: logits, shape: [S, C]}                      # [1, C] for point and all
      temperature: 1.3
      temperature_folded: false
      weights: dequantize | hybrid | float
      macs: <int, per invoke>
      params: <int>
      unique_values: <int> | null
      thresholds: {'0.95': 0.82, '0.99': null}   # target accuracy -> minimum confidence (validation)
      cascade:                        # optional: this configuration as a cascade's first stage
        w1.00-point: {threshold: 0.91, coverage: 0.62, max_loss: 0.002}
                                      # answer here when confidence >= threshold, else run the
                                      # wider configuration; on validation, `coverage` of the
                                      # samples are answered here and accuracy drops <= max_loss
      val_nll: 0.31
      val_accuracy: 0.93              # schema version 10, optional: validation accuracy (what
                                      # the device rules compare); absent: not recorded
      test: {raw: {accuracy: ..., nll: ..., ece: ..., brier: ...}, calibrated: {...}}
      latency_ms: <float> | null      # measured on the exporting host; null with --no-measure
      memory_mb: <float> | null
      materialize:                    # (the first version-3 store form: one recipe per
      - {width: '0.50', sample: null, heads: 8}   # file with the files as entries; read, and
                                      # written as the slices table + names)
    graphs: {'0.50': {...}}           # layout store only: width key -> the width's point graph
                                      # description (edge_sdk.tflite.graph.Graph.to_dict, weights by
                                      # reference, int8 scales filled at materialisation)

Every record is a frozen dataclass validated on construction; ``from_dict`` raises
:class:`~edge_sdk.errors.BundleError` naming the dotted key path of the first problem
(``configurations[2].files[0].sha256: expected 64 hex characters (lowercase), got '...'``).
YAML is read with the safe loader only (``yaml.CSafeLoader``, ``yaml.SafeLoader`` without libyaml),
so a manifest cannot execute code.

stdlib + pyyaml only: this package runs on the device (never import torch or the workstation
packages here).

Imports: edge_sdk.errors, edge_sdk.validation, edge_sdk.tflite.
"""
from __future__ import annotations

from edge_sdk.bundle.configuration import Configuration
from edge_sdk.bundle.manifest import Manifest
from edge_sdk.bundle.files import PathLike, resolve_file, sha256_file
from edge_sdk.bundle.reading import manifest_to_yaml, read_manifest, verify_files
from edge_sdk.bundle.input_spec import InputSpec
from edge_sdk.bundle.preprocess import INTERPOLATIONS, Preprocess
from edge_sdk.bundle.records import (
    BUNDLE_LAYOUTS,
    FILE_SUFFIX,
    INPUT_DTYPES,
    LAYOUTS,
    MANIFEST_NAME,
    OUTPUT_KINDS,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    SCOPES,
    STORE_SUFFIX,
    WEIGHT_ROUTES,
    FileEntry,
    OutputSpec,
    Recipe,
    Slice,
    StoreEntry,
    file_entry,
    width_key,
)
from edge_sdk.bundle.recovery import ExportLock
from edge_sdk.bundle.stats import InputStats
from edge_sdk.bundle.slices import check_slice, read_slices, verify_bytes
from edge_sdk.bundle.writing import write_bundle
from edge_sdk.errors import BundleError  # noqa: F401 (tests and exporters reach it as bundle.BundleError)

__all__ = [
    "BUNDLE_LAYOUTS",
    "INPUT_DTYPES",
    "INTERPOLATIONS",
    "LAYOUTS",
    "MANIFEST_NAME",
    "OUTPUT_KINDS",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "SCOPES",
    "STORE_SUFFIX",
    "WEIGHT_ROUTES",
    "Configuration",
    "ExportLock",
    "FileEntry",
    "InputStats",
    "InputSpec",
    "Manifest",
    "OutputSpec",
    "Preprocess",
    "Recipe",
    "Slice",
    "StoreEntry",
    "check_slice",
    "file_entry",
    "manifest_to_yaml",
    "read_manifest",
    "read_slices",
    "resolve_file",
    "sha256_file",
    "verify_bytes",
    "verify_files",
    "width_key",
    "write_bundle",
]
