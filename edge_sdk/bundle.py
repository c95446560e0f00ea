"""The bundle format: a directory holding ``manifest.yaml`` and the ``.tflite`` files it lists.

The exporter writes bundles through :func:`write_bundle`; the runtime reads them with
:func:`read_manifest`. This module owns the schema, so both sides agree on it by construction.

Schema version 1 (``manifest.yaml``)::

    schema_version: 1
    input:            # what predict accepts, before normalisation; model input = (raw - mean) / std
      shape: [1, H, W, C]
      layout: NHWC
      dtype: float32 | uint8
      value_range: [lo, hi]
      mean: [C floats]
      std: [C floats, > 0]
    labels: [class names]             # one per output class; non-empty, unique
    source: {...}                     # free-form provenance (plain YAML values)
    configurations:                   # non-empty; ids unique
    - id: w0.50-head8
      width: 0.5                      # 0 < width <= 1
      scope: point | head | all
      samples: 8                      # point: 1
      files: [{name: x.tflite, sha256: <64 hex>, bytes: <int>}]   # point/head: 1 file, all: `samples`
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
      test: {raw: {accuracy: ..., nll: ..., ece: ..., brier: ...}, calibrated: {...}}
      latency_ms: <float> | null      # measured on the exporting host; null with --no-measure
      memory_mb: <float> | null

Every record is a frozen dataclass validated on construction; ``from_dict`` raises
:class:`~edge_sdk.errors.BundleError` naming the dotted key path of the first problem
(``configurations[2].files[0].sha256: expected 64 hex characters (lowercase), got '...'``).
YAML is read with ``yaml.safe_load`` only, so a manifest cannot execute code.

stdlib + pyyaml only: this module runs on the device (never import torch or the workstation
packages here).
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn, Union

import yaml

from edge_sdk.errors import BundleError, DataError, InputSpecError, InputSpecMismatchError

__all__ = [
    "INPUT_DTYPES",
    "LAYOUTS",
    "MANIFEST_NAME",
    "OUTPUT_KINDS",
    "SCHEMA_VERSION",
    "SCOPES",
    "WEIGHT_ROUTES",
    "Configuration",
    "FileEntry",
    "InputSpec",
    "Manifest",
    "OutputSpec",
    "file_entry",
    "manifest_to_yaml",
    "read_manifest",
    "resolve_file",
    "sha256_file",
    "verify_files",
    "write_bundle",
]

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.yaml"
FILE_SUFFIX = ".tflite"

LAYOUTS = ("NHWC",)
INPUT_DTYPES = ("float32", "uint8")
SCOPES = ("point", "head", "all")
WEIGHT_ROUTES = ("dequantize", "hybrid", "float")
OUTPUT_KINDS = ("logits",)

PathLike = Union[str, "os.PathLike[str]"]

_CHUNK = 1 << 20  # hashing reads files in 1 MiB chunks
_MAX_MANIFEST_BYTES = 16 << 20  # a real manifest is a few kB; refuse to parse anything absurd
_MAX_DEPTH = 64  # nesting of free-form values (source, ...)
_MAX_NODES = 200_000  # values visited in free-form data (defuses YAML alias bombs)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


# --------------------------------------------------------------------------- validation helpers


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _key(path: str, key: object) -> str:
    """Path of a free-form mapping key: dotted when it reads as an identifier, else subscripted."""
    if isinstance(key, str) and key.isidentifier():
        return _join(path, key)
    return f"{path}[{key!r}]"


def _fail(path: str, message: str) -> NoReturn:
    raise BundleError(f"{path}: {message}" if path else message)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _got(value: object) -> str:
    return f"got {type(value).__name__} {_show(value)}"


def _int(value: object, path: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(path, f"expected an integer, {_got(value)}")
    result = int(value)
    if minimum is not None and result < minimum:
        _fail(path, f"expected an integer >= {minimum}, got {result}")
    return result


def _float(
    value: object,
    path: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(path, f"expected a number, {_got(value)}")
    result = float(value)
    if not math.isfinite(result):
        _fail(path, f"expected a finite number, got {result}")
    if gt is not None and not result > gt:
        _fail(path, f"expected a number > {gt:g}, got {result!r}")
    if ge is not None and not result >= ge:
        _fail(path, f"expected a number >= {ge:g}, got {result!r}")
    if le is not None and not result <= le:
        _fail(path, f"expected a number <= {le:g}, got {result!r}")
    return result


def _optional_float(value: object, path: str, **bounds: float) -> float | None:
    return None if value is None else _float(value, path, **bounds)


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        _fail(path, f"expected a string, {_got(value)}")
    if not value:
        _fail(path, "expected a non-empty string")
    return str(value)  # a plain str (subclasses do not survive yaml.safe_dump)


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        _fail(path, f"expected true or false, {_got(value)}")
    return value


def _choice(value: object, path: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        _fail(path, f"expected one of {', '.join(repr(c) for c in choices)}, {_got(value)}")
    return str(value)


def _list(value: object, path: str, *, length: int | None = None, nonempty: bool = False) -> list:
    if not isinstance(value, (list, tuple)):
        _fail(path, f"expected a list, {_got(value)}")
    if length is not None and len(value) != length:
        _fail(path, f"expected a list of {length} items, got {len(value)}: {_show(list(value))}")
    if nonempty and not value:
        _fail(path, "expected a non-empty list")
    return list(value)


def _mapping(value: object, path: str) -> Mapping:
    if not isinstance(value, Mapping):
        _fail(path, f"expected a mapping, {_got(value)}")
    return value


def _file_name(value: object, path: str) -> str:
    """A plain ``*.tflite`` file name that can only refer to a file directly inside the bundle."""
    name = _str(value, path)
    expected = f"a plain file name ending in {FILE_SUFFIX!r}"
    if "/" in name or "\\" in name or (os.altsep and os.altsep in name):
        _fail(path, f"expected {expected} (no path separators), got {name!r}")
    if name in (".", ".."):
        _fail(path, f"expected {expected}, got {name!r}")
    if name.startswith("."):
        _fail(path, f"expected {expected} not starting with '.', got {name!r}")
    if ":" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        _fail(path, f"expected {expected} without ':' or control characters, got {name!r}")
    if not name.endswith(FILE_SUFFIX):
        _fail(path, f"expected {expected}, got {name!r}")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        _fail(path, f"expected {expected} in valid UTF-8, got {name!r}")
    if len(encoded) > 255:
        _fail(path, f"expected {expected} of at most 255 bytes, got {len(encoded)} bytes")
    return name


class _Budget:
    """Counts values visited in free-form data, so alias-expanded YAML cannot blow up."""

    def __init__(self) -> None:
        self.left = _MAX_NODES

    def spend(self, path: str) -> None:
        self.left -= 1
        if self.left < 0:
            _fail(path, f"free-form data too large (more than {_MAX_NODES} values)")


def _plain(value: object, path: str, budget: _Budget, depth: int = 0) -> Any:
    """A deep copy of ``value`` made of plain YAML values (null, bool, int, float, str, list, map)."""
    budget.spend(path)
    if depth > _MAX_DEPTH:
        _fail(path, f"nested more than {_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        result = float(value)
        if math.isnan(result):
            _fail(path, "expected a plain YAML value, got NaN")
        return result
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(path, f"mapping keys must be strings, got {type(key).__name__} {_show(key)}")
            out[str(key)] = _plain(item, _key(path, key), budget, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{path}[{i}]", budget, depth + 1) for i, item in enumerate(value)]
    _fail(
        path,
        "expected a plain YAML value (null, bool, int, float, str, list or mapping), "
        f"got {type(value).__name__}",
    )


def _to_plain(value: object) -> Any:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- records


class _Record:
    """Frozen-dataclass mixin: validate and normalise on construction, dict round trip.

    Subclasses implement ``_parse(values, path) -> normalised values``; it raises
    :class:`BundleError` naming ``path`` plus the key. ``from_dict`` calls it with the real
    dotted path; ``__post_init__`` runs it again (with the class name as the path) so a record
    constructed directly in Python is held to the same rules.
    """

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        for name, value in self._parse(values, type(self).__name__).items():
            object.__setattr__(self, name, value)

    @classmethod
    def _parse(cls, values: dict[str, Any], path: str) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = ""):
        """Build from plain data (e.g. parsed YAML); ``path`` prefixes error key paths."""
        data = _mapping(data, path)
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        unknown = [k for k in data if k not in names]
        if unknown:
            _fail(
                path,
                f"unknown key(s) {', '.join(_show(k) for k in unknown)}; "
                f"expected keys: {', '.join(names)}",
            )
        values: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in data:
                values[f.name] = data[f.name]
            elif f.default is not MISSING:
                values[f.name] = f.default
            elif f.default_factory is not MISSING:
                values[f.name] = f.default_factory()
            else:
                _fail(_join(path, f.name), "missing required key")
        return cls(**cls._parse(values, path))

    def to_dict(self) -> dict[str, Any]:
        """Plain data (dicts, lists, scalars) in schema key order; a deep copy."""
        return {f.name: _to_plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]


def _record(cls: type, value: object, path: str) -> Any:
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls.from_dict(value, path)
    _fail(path, f"expected a mapping ({cls.__name__}), {_got(value)}")


@dataclass(frozen=True)
class FileEntry(_Record):
    """One file of the bundle: a plain ``*.tflite`` name, its sha256 (hex) and size in bytes."""

    name: str
    sha256: str
    bytes: int

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        name = _file_name(v["name"], _join(path, "name"))
        sha = v["sha256"]
        if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
            _fail(_join(path, "sha256"), f"expected 64 hex characters (lowercase), got {_show(sha)}")
        size = _int(v["bytes"], _join(path, "bytes"), minimum=1)
        return {"name": name, "sha256": str(sha), "bytes": size}


def file_entry(name: str, data: bytes | bytearray | memoryview) -> FileEntry:
    """The :class:`FileEntry` for ``data`` stored under ``name`` (computes sha256 and size)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BundleError(f"file_entry({name!r}): expected bytes, {_got(data)}")
    blob = bytes(data)
    return FileEntry(name=name, sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))


@dataclass(frozen=True, kw_only=True)
class InputSpec(_Record):
    """What ``predict`` accepts, before normalisation: model input = (raw - mean) / std.

    The project's one input spec. The training split defines it (``trainer.data.load_data``:
    shape, dtype, value range, per-channel mean and std of the training split, and the class
    names as ``classes``); the checkpoint carries it under ``input_spec``; quantize and export
    cross-check reloaded data against it (:meth:`check_matches`) instead of recomputing it; the
    manifest's ``input`` is the same record without ``classes`` (a manifest names its classes
    in the top-level ``labels``). Errors are :class:`~edge_sdk.errors.InputSpecError`, both a
    ``BundleError`` and a ``DataError``.
    """

    shape: tuple[int, ...]  # (1, H, W, C): one NHWC sample as the device feeds it
    layout: str = "NHWC"  # the TFLite convention
    dtype: str  # "uint8" | "float32": raw input dtype on the device
    value_range: tuple[float, float]  # raw pixel range, e.g. (0, 16) digits, (0, 255) images
    mean: tuple[float, ...]  # per channel, raw units, from the TRAINING split
    std: tuple[float, ...]
    # the training data's class names (checkpoints); None in a manifest, whose labels hold them
    classes: tuple[str, ...] | None = field(default=None, metadata={"manifest": False})

    @property
    def channels(self) -> int:
        return self.shape[3]

    @property
    def num_classes(self) -> int:
        if self.classes is None:
            raise InputSpecError("this input spec carries no class names (a manifest's input: "
                                 "the manifest's labels name the classes)")
        return len(self.classes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "") -> InputSpec:
        try:
            return super().from_dict(data, path)
        except InputSpecError:
            raise
        except BundleError as exc:
            raise InputSpecError(str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain data in schema key order; ``classes`` only when carried (never in a manifest)."""
        out = super().to_dict()
        if self.classes is None:
            del out["classes"]
        return out

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        try:
            return cls._parse_fields(v, path)
        except InputSpecError:
            raise
        except BundleError as exc:
            raise InputSpecError(str(exc)) from None

    @classmethod
    def _parse_fields(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        p = _join(path, "shape")
        shape = tuple(
            _int(x, f"{p}[{i}]", minimum=1) for i, x in enumerate(_list(v["shape"], p, length=4))
        )
        if shape[0] != 1:
            _fail(f"{p}[0]", f"expected batch dimension 1 (shape [1, H, W, C]), got {shape[0]}")
        layout = _choice(v["layout"], _join(path, "layout"), LAYOUTS)
        dtype = _choice(v["dtype"], _join(path, "dtype"), INPUT_DTYPES)
        p = _join(path, "value_range")
        items = _list(v["value_range"], p, length=2)
        lo, hi = (_float(x, f"{p}[{i}]") for i, x in enumerate(items))
        if not lo < hi:
            _fail(p, f"expected [lo, hi] with lo < hi, got [{lo!r}, {hi!r}]")
        if dtype == "uint8" and not (0 <= lo and hi <= 255):
            _fail(p, f"expected a range inside [0, 255] for dtype uint8, got [{lo!r}, {hi!r}]")
        channels = shape[3]
        p = _join(path, "mean")
        mean = tuple(
            _float(x, f"{p}[{i}]") for i, x in enumerate(_list(v["mean"], p, length=channels))
        )
        p = _join(path, "std")
        std = tuple(
            _float(x, f"{p}[{i}]", gt=0.0)
            for i, x in enumerate(_list(v["std"], p, length=channels))
        )
        classes = v["classes"]
        if classes is not None:
            p = _join(path, "classes")
            items = _list(classes, p, nonempty=True)  # a lone string is not a list of names
            for i, name in enumerate(items):
                if not isinstance(name, str):
                    _fail(f"{p}[{i}]", f"expected a class name (string), {_got(name)}")
            classes = tuple(str(name) for name in items)
        return {
            "shape": shape,
            "layout": layout,
            "dtype": dtype,
            "value_range": (lo, hi),
            "mean": mean,
            "std": std,
            "classes": classes,
        }

    def normalize(self, raw: Any) -> Any:
        """Raw NHWC input -> float32 NHWC model input, ``(raw - mean) / std`` (numpy); grey
        images may come as N x H x W (the channel axis is added, as for training data)."""
        import numpy as np  # numpy only here: the schema itself is stdlib + pyyaml

        raw = np.asarray(raw)
        if raw.ndim == 3 and self.channels == 1:
            raw = raw[..., None]
        if raw.ndim != 4 or raw.shape[1:] != self.shape[1:]:
            want = ", ".join(map(str, self.shape[1:]))
            raise DataError(f"expected raw input of shape (N, {want}), got {raw.shape}")
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        return ((raw.astype(np.float32) - mean) / std).astype(np.float32)

    def mismatches(self, other: InputSpec) -> list[tuple[str, Any, Any]]:
        """``(field, this value, other value)`` for every field on which ``other`` differs.

        The statistics and the value range are computed in floating point, so they compare
        with a relative tolerance of 1e-6; everything else exactly. ``classes`` only when
        both specs carry them.
        """
        out: list[tuple[str, Any, Any]] = []
        for name in ("shape", "layout", "dtype", "value_range", "mean", "std", "classes"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if name == "classes" and (mine is None or theirs is None):
                continue
            if name in ("value_range", "mean", "std"):
                same = len(mine) == len(theirs) and all(
                    math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(mine, theirs))
            else:
                same = mine == theirs
            if not same:
                out.append((name, mine, theirs))
        return out

    def check_matches(self, other: InputSpec, *, what: str, mine: str = "expected",
                      theirs: str = "found") -> None:
        """Raise :class:`~edge_sdk.errors.InputSpecMismatchError` when ``other`` differs from
        this spec (see :meth:`mismatches`), naming each differing field with both values, e.g.
        ``mean: the checkpoint (8.2,), the data (9.1,)``. ``what`` says what was compared."""
        diffs = self.mismatches(other)
        if diffs:
            listed = "; ".join(f"{name}: {mine} {_spec_value(a)}, {theirs} {_spec_value(b)}"
                               for name, a, b in diffs)
            raise InputSpecMismatchError(f"{what}: {listed}")


def _spec_value(value: Any) -> str:
    if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
        return "(" + ", ".join(f"{v:.9g}" for v in value) + ("," if len(value) == 1 else "") + ")"
    return _show(value)


@dataclass(frozen=True, kw_only=True)
class OutputSpec(_Record):
    """The output tensor of a configuration's file(s): ``[1, C]``, or ``[S, C]`` for head scope."""

    kind: str = "logits"
    shape: tuple[int, int]

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        kind = _choice(v["kind"], _join(path, "kind"), OUTPUT_KINDS)
        p = _join(path, "shape")
        shape = tuple(
            _int(x, f"{p}[{i}]", minimum=1) for i, x in enumerate(_list(v["shape"], p, length=2))
        )
        return {"kind": kind, "shape": shape}


def _thresholds(value: object, path: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, conf in _mapping(value, path).items():
        p = _key(path, key)
        target = None
        if isinstance(key, str):
            try:
                target = float(key)
            except ValueError:
                pass
        if target is None or not 0.0 < target <= 1.0:
            _fail(
                p,
                "keys must be target accuracies in (0, 1] written as strings like '0.95', "
                f"got {type(key).__name__} {_show(key)}",
            )
        out[str(key)] = _optional_float(conf, p, ge=0.0, le=1.0)
    return out


def _cascade(value: object, path: str) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for target, entry in _mapping(value, path).items():
        tp = _key(path, target)
        _str(target, tp)
        e = _mapping(entry, tp)
        want = {"threshold", "coverage", "max_loss"}
        if set(e) != want:
            _fail(tp, f"expected keys {', '.join(sorted(want))}, got {', '.join(map(str, e))}")
        out[str(target)] = {
            "threshold": _optional_float(e["threshold"], _join(tp, "threshold"), ge=0.0, le=1.0),
            "coverage": _float(e["coverage"], _join(tp, "coverage"), ge=0.0, le=1.0),
            "max_loss": _float(e["max_loss"], _join(tp, "max_loss"), ge=0.0, le=1.0)}
    return out


def _test_metrics(value: object, path: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for group, metrics in _mapping(value, path).items():
        gp = _key(path, group)
        _str(group, gp)
        inner: dict[str, float] = {}
        for name, number in _mapping(metrics, gp).items():
            mp = _key(gp, name)
            _str(name, mp)
            inner[str(name)] = _float(number, mp)
        out[str(group)] = inner
    return out


@dataclass(frozen=True, kw_only=True)
class Configuration(_Record):
    """One runnable (width, scope, samples) configuration and what was measured about it."""

    id: str
    width: float
    scope: str
    samples: int
    files: tuple[FileEntry, ...]
    invokes: int
    output: OutputSpec
    temperature: float
    temperature_folded: bool
    weights: str
    macs: int
    params: int
    unique_values: int | None = None
    # entropy in bits over the exact weight values of the slice (before folding); None when not
    # quantized
    weight_entropy_bits: float | None = None
    thresholds: dict[str, float | None]
    # wider configuration id -> {threshold, coverage, max_loss}: see the module docstring
    cascade: dict[str, dict[str, float | None]] = field(default_factory=dict)
    val_nll: float
    test: dict[str, dict[str, float]]
    latency_ms: float | None = None
    memory_mb: float | None = None

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["id"] = _str(v["id"], _join(path, "id"))
        out["width"] = _float(v["width"], _join(path, "width"), gt=0.0, le=1.0)
        scope = out["scope"] = _choice(v["scope"], _join(path, "scope"), SCOPES)
        samples = out["samples"] = _int(v["samples"], _join(path, "samples"), minimum=1)
        if scope == "point" and samples != 1:
            _fail(_join(path, "samples"), f"expected 1 for scope 'point', got {samples}")

        p = _join(path, "files")
        files = tuple(
            _record(FileEntry, item, f"{p}[{i}]") for i, item in enumerate(_list(v["files"], p))
        )
        want = samples if scope == "all" else 1
        if len(files) != want:
            why = f"one per sample (samples={samples})" if scope == "all" else "exactly one"
            _fail(p, f"expected {want} file(s) for scope {scope!r} ({why}), got {len(files)}")
        seen: dict[str, int] = {}
        for i, entry in enumerate(files):
            if entry.name in seen:
                _fail(f"{p}[{i}].name", f"duplicate file {entry.name!r} (also {p}[{seen[entry.name]}])")
            seen[entry.name] = i
        out["files"] = files

        invokes = out["invokes"] = _int(v["invokes"], _join(path, "invokes"), minimum=1)
        if invokes != want:
            _fail(
                _join(path, "invokes"),
                f"expected {want} for scope {scope!r} with samples={samples}, got {invokes}",
            )
        output = out["output"] = _record(OutputSpec, v["output"], _join(path, "output"))
        rows = samples if scope == "head" else 1
        if output.shape[0] != rows:
            shape = "[S, C] with S = samples" if scope == "head" else "[1, C]"
            _fail(
                _join(_join(path, "output"), "shape"),
                f"expected {shape} for scope {scope!r} (samples={samples}), "
                f"got {list(output.shape)}",
            )
        out["temperature"] = _float(v["temperature"], _join(path, "temperature"), gt=0.0)
        out["temperature_folded"] = _bool(v["temperature_folded"], _join(path, "temperature_folded"))
        out["weights"] = _choice(v["weights"], _join(path, "weights"), WEIGHT_ROUTES)
        out["macs"] = _int(v["macs"], _join(path, "macs"), minimum=0)
        out["params"] = _int(v["params"], _join(path, "params"), minimum=0)
        uv = v["unique_values"]
        out["unique_values"] = (
            None if uv is None else _int(uv, _join(path, "unique_values"), minimum=0)
        )
        out["weight_entropy_bits"] = _optional_float(
            v["weight_entropy_bits"], _join(path, "weight_entropy_bits"), ge=0.0)
        out["thresholds"] = _thresholds(v["thresholds"], _join(path, "thresholds"))
        out["cascade"] = _cascade(v["cascade"], _join(path, "cascade"))
        out["val_nll"] = _float(v["val_nll"], _join(path, "val_nll"), ge=0.0)
        out["test"] = _test_metrics(v["test"], _join(path, "test"))
        out["latency_ms"] = _optional_float(v["latency_ms"], _join(path, "latency_ms"), ge=0.0)
        out["memory_mb"] = _optional_float(v["memory_mb"], _join(path, "memory_mb"), ge=0.0)
        return out


def _check_version(value: object, path: str) -> int:
    version = _int(value, path)
    if version != SCHEMA_VERSION:
        _fail(
            path,
            f"unsupported schema version {version}; this edge_sdk reads schema version "
            f"{SCHEMA_VERSION} (re-export the bundle, or use a matching edge_sdk)",
        )
    return version


@dataclass(frozen=True, kw_only=True)
class Manifest(_Record):
    """The whole ``manifest.yaml``."""

    schema_version: int = SCHEMA_VERSION
    input: InputSpec
    labels: tuple[str, ...]
    source: dict[str, Any] = field(default_factory=dict)
    configurations: tuple[Configuration, ...]

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.configurations)

    def configuration(self, id: str) -> Configuration:  # noqa: A002 - the manifest's key name
        """The configuration called ``id``; BundleError listing the available ids otherwise."""
        for config in self.configurations:
            if config.id == id:
                return config
        raise BundleError(
            f"no configuration {id!r} in this bundle; available: {', '.join(self.ids)}"
        )

    def file_entries(self) -> tuple[FileEntry, ...]:
        """Every file of the bundle once, in manifest order."""
        seen: dict[str, FileEntry] = {}
        for config in self.configurations:
            for entry in config.files:
                seen.setdefault(entry.name, entry)
        return tuple(seen.values())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "") -> Manifest:
        data = _mapping(data, path or "manifest")
        # The version decides what every other key means: check it first.
        if "schema_version" not in data:
            _fail(_join(path, "schema_version"), "missing required key")
        _check_version(data["schema_version"], _join(path, "schema_version"))
        return super().from_dict(data, path)

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["schema_version"] = _check_version(v["schema_version"], _join(path, "schema_version"))
        out["input"] = _record(InputSpec, v["input"], _join(path, "input"))
        if out["input"].classes is not None:
            _fail(_join(path, "input.classes"), "unknown key: a manifest's input carries no class "
                  "names (its top-level labels do)")

        p = _join(path, "labels")
        items = _list(v["labels"], p, nonempty=True)
        labels = tuple(_str(x, f"{p}[{i}]") for i, x in enumerate(items))
        first: dict[str, int] = {}
        for i, label in enumerate(labels):
            if label in first:
                _fail(f"{p}[{i}]", f"duplicate label {label!r} (also {p}[{first[label]}])")
            first[label] = i
        out["labels"] = labels

        p = _join(path, "source")
        out["source"] = _plain(_mapping(v["source"], p), p, _Budget())

        p = _join(path, "configurations")
        configs = tuple(
            _record(Configuration, item, f"{p}[{i}]")
            for i, item in enumerate(_list(v["configurations"], p, nonempty=True))
        )
        ids: dict[str, int] = {}
        files: dict[str, tuple[FileEntry, str]] = {}
        folded: dict[str, str] = {}
        for i, config in enumerate(configs):
            cp = f"{p}[{i}]"
            if config.id in ids:
                _fail(
                    _join(cp, "id"),
                    f"duplicate configuration id {config.id!r} (also {p}[{ids[config.id]}])",
                )
            ids[config.id] = i
            classes = config.output.shape[1]
            if classes != len(labels):
                _fail(
                    f"{cp}.output.shape[1]",
                    f"expected {len(labels)} classes (one per label), got {classes}",
                )
            for j, entry in enumerate(config.files):
                fp = f"{cp}.files[{j}]"
                if entry.name in files:
                    other, where = files[entry.name]
                    if other != entry:
                        _fail(
                            fp,
                            f"file {entry.name!r} is also listed by {where} "
                            "with a different sha256 or size",
                        )
                    continue
                lower = entry.name.casefold()
                if lower in folded and folded[lower] != entry.name:
                    _fail(
                        f"{fp}.name",
                        f"file names must differ by more than letter case ({entry.name!r} "
                        f"vs {folded[lower]!r}): they collide on case-insensitive file systems",
                    )
                files[entry.name] = (entry, fp)
                folded[lower] = entry.name
        by_id = {c.id: c for c in configs}
        for i, config in enumerate(configs):
            for target in config.cascade:
                other = by_id.get(target)
                if other is None or other.scope != config.scope or other.width <= config.width:
                    _fail(f"{p}[{i}].cascade.{target}", "expected the id of a wider configuration "
                          f"of the same scope ({config.scope!r}, width > {config.width:g})")
        out["configurations"] = configs
        return out


# --------------------------------------------------------------------------- reading


def manifest_to_yaml(manifest: Manifest) -> str:
    """The ``manifest.yaml`` text for ``manifest``, checked to read back as an equal Manifest."""
    if not isinstance(manifest, Manifest):
        raise BundleError(f"expected a Manifest, {_got(manifest)}")
    try:
        data = Manifest.from_dict(manifest.to_dict()).to_dict()  # re-validate: dicts are mutable
    except BundleError as exc:
        raise BundleError(f"invalid manifest: {exc}") from None
    # ASCII output (allow_unicode=False): PyYAML's unicode mode writes U+0085 in a way it cannot
    # read back (found by the round-trip property test); escapes round-trip everything.
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    text = f"# edge-sdk bundle manifest (schema version {SCHEMA_VERSION})\n{body}"
    if _parse_manifest_text(text.encode("utf-8"), MANIFEST_NAME) != manifest:
        raise BundleError("manifest does not survive a YAML round trip; refusing to write it")
    return text


def _parse_manifest_text(data: bytes, where: str) -> Manifest:
    if len(data) > _MAX_MANIFEST_BYTES:
        raise BundleError(f"{where}: {len(data)} bytes; a manifest is at most {_MAX_MANIFEST_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleError(f"{where}: not valid UTF-8 (byte {exc.start})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or type(exc).__name__
        raise BundleError(f"{where}: invalid YAML{at}: {problem}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise BundleError(f"{where}: invalid YAML: {exc}") from None
    if not isinstance(raw, Mapping):
        raise BundleError(
            f"{where}: expected a YAML mapping at the top level, got {type(raw).__name__}"
        )
    try:
        return Manifest.from_dict(raw)
    except BundleError as exc:
        raise BundleError(f"{where}: {exc}") from None
    except RecursionError:
        raise BundleError(f"{where}: nested too deeply") from None


def sha256_file(path: PathLike) -> tuple[str, int]:
    """(hex sha256, bytes read) of a file, hashed in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def resolve_file(bundle_dir: PathLike, name: str) -> Path:
    """The path of bundle file ``name``, which must exist and resolve to inside ``bundle_dir``."""
    _file_name(name, "file name")
    root = Path(bundle_dir).resolve()
    candidate = root / name
    resolved = candidate.resolve()  # follows symlinks
    if resolved == root or not resolved.is_relative_to(root):
        raise BundleError(
            f"{root}: file {name!r} resolves to {resolved}, outside the bundle directory; "
            "bundle files must be inside the bundle"
        )
    if not resolved.exists():
        raise BundleError(f"{root}: file {name!r} listed in the manifest is missing")
    if not resolved.is_file():
        raise BundleError(f"{root}: {name!r} is not a regular file")
    return resolved


def verify_files(bundle_dir: PathLike, manifest: Manifest) -> None:
    """Check every file of ``manifest`` in ``bundle_dir``: inside the bundle, size and sha256."""
    root = Path(bundle_dir)
    for entry in manifest.file_entries():
        path = resolve_file(root, entry.name)
        try:
            size = path.stat().st_size
            if size == entry.bytes:
                digest, size = sha256_file(path)
        except OSError as exc:
            raise BundleError(f"{root}: cannot read {entry.name!r}: {exc}") from None
        if size != entry.bytes:
            raise BundleError(
                f"{root}: file {entry.name!r} has {size} bytes, the manifest says {entry.bytes} "
                "(truncated or modified)"
            )
        if digest != entry.sha256:
            raise BundleError(
                f"{root}: checksum mismatch for {entry.name!r}: manifest sha256 {entry.sha256}, "
                f"file sha256 {digest} (corrupted or modified)"
            )


def read_manifest(bundle_dir: PathLike, verify: bool = True) -> Manifest:
    """Read and validate ``bundle_dir/manifest.yaml``; with ``verify``, check every file too."""
    root = Path(bundle_dir)
    if not root.exists():
        raise BundleError(f"bundle directory not found: {root}")
    if not root.is_dir():
        raise BundleError(
            f"not a bundle: {root} is not a directory (expected one holding {MANIFEST_NAME})"
        )
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(f"not a bundle: {root} has no {MANIFEST_NAME}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc}") from None
    manifest = _parse_manifest_text(data, str(path))
    if verify:
        verify_files(root, manifest)
    return manifest


# --------------------------------------------------------------------------- writing


def _checked_files(manifest: Manifest, files: Mapping[str, Any]) -> dict[str, bytes]:
    if not isinstance(files, Mapping):
        raise BundleError(f"files: expected a mapping of file name -> bytes, {_got(files)}")
    provided: dict[str, bytes] = {}
    for name, blob in files.items():
        path = f"files[{name!r}]"
        _file_name(name, path)
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise BundleError(f"{path}: expected bytes, {_got(blob)}")
        provided[name] = bytes(blob)
    entries = manifest.file_entries()
    listed = {e.name for e in entries}
    missing = [e.name for e in entries if e.name not in provided]
    if missing:
        raise BundleError(f"no data provided for file(s) listed in the manifest: {', '.join(missing)}")
    extra = [name for name in provided if name not in listed]
    if extra:
        raise BundleError(
            f"file(s) provided but not listed by any configuration in the manifest: {', '.join(extra)}"
        )
    for entry in entries:
        blob = provided[entry.name]
        if len(blob) != entry.bytes:
            raise BundleError(
                f"{entry.name!r}: the manifest says {entry.bytes} bytes, the data has {len(blob)} "
                "(build entries with file_entry(name, data))"
            )
        digest = hashlib.sha256(blob).hexdigest()
        if digest != entry.sha256:
            raise BundleError(
                f"{entry.name!r}: manifest sha256 {entry.sha256} does not match the data's "
                f"sha256 {digest} (build entries with file_entry(name, data))"
            )
    return {entry.name: provided[entry.name] for entry in entries}


def _fresh_name(parent: Path, stem: str) -> Path:
    for _ in range(100):
        candidate = parent / f"{stem}{secrets.token_hex(4)}"
        if not os.path.lexists(candidate):
            return candidate
    raise BundleError(f"cannot find an unused temporary name in {parent}")


def _make_temp_dir(parent: Path, stem: str) -> Path:
    # Not tempfile.mkdtemp: its 0700 mode would make the bundle unreadable to other users.
    for _ in range(100):
        candidate = _fresh_name(parent, stem)
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise BundleError(f"cannot create a temporary directory in {parent}")


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Best effort: persist a directory's entries (not supported on every platform)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_target(target: Path, force: bool) -> bool:
    """Whether ``target`` exists (and may be replaced); BundleError if it must not be."""
    if not os.path.lexists(target):
        return False
    if not force:
        raise BundleError(f"{target} already exists; pass --force (force=True) to replace it")
    if target.is_symlink() or not target.is_dir():
        raise BundleError(f"{target} exists and is not a bundle directory; refusing to replace it")
    if not (target / MANIFEST_NAME).is_file() and any(target.iterdir()):
        raise BundleError(
            f"{target} exists and is not a bundle (no {MANIFEST_NAME}); refusing to replace it "
            "even with --force"
        )
    return True


def _swap(new: Path, target: Path) -> None:
    """Replace directory ``target`` by ``new``: old aside, new in, then delete the old one."""
    old = _fresh_name(target.parent, f".{target.name}.old-")
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        try:
            os.replace(old, target)
        except OSError as exc:
            raise BundleError(
                f"could not replace {target}, and could not restore the previous bundle, "
                f"which is now at {old}: {exc}"
            ) from exc
        raise
    shutil.rmtree(old, ignore_errors=True)
    if os.path.lexists(old):
        warnings.warn(f"could not delete the previous bundle moved aside to {old}", stacklevel=3)


def write_bundle(
    bundle_dir: PathLike,
    manifest: Manifest,
    files: Mapping[str, bytes],
    *,
    force: bool = False,
) -> Path:
    """Write ``manifest`` and ``files`` (name -> bytes) as the bundle directory ``bundle_dir``.

    ``files`` must hold exactly the files the manifest lists, with matching sha256 and size
    (make entries with :func:`file_entry`). Everything is written and fsynced in a hidden
    temporary directory next to the target, then renamed into place, so readers see either
    no bundle, the old one or the complete new one. An existing bundle is replaced only with
    ``force`` (old renamed aside, new renamed in, old deleted). On any failure the temporary
    directory is removed and an existing bundle is left as it was. Returns the bundle path.
    """
    text = manifest_to_yaml(manifest)
    blobs = _checked_files(manifest, files)
    target = Path(os.path.abspath(os.fspath(bundle_dir)))
    if target.name in ("", ".", ".."):
        raise BundleError(f"bundle_dir must name a directory, got {os.fspath(bundle_dir)!r}")
    parent = target.parent
    _check_target(target, force)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = _make_temp_dir(parent, f".{target.name}.tmp-")
    except OSError as exc:
        raise BundleError(f"could not write bundle {target}: {exc}") from exc
    try:
        for name, data in blobs.items():
            _write_synced(tmp / name, data)
        _write_synced(tmp / MANIFEST_NAME, text.encode("utf-8"))
        _fsync_dir(tmp)
        if _check_target(target, force):  # checked again: it may have appeared meanwhile
            _swap(tmp, target)
        else:
            os.replace(tmp, target)
        _fsync_dir(parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise BundleError(f"could not write bundle {target}: {exc}") from exc
        raise
    return target
