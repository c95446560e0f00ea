"""The manifest's building blocks: the record base class, :class:`FileEntry`, :class:`Recipe`,
:class:`Slice` and :class:`OutputSpec`, and the format's constants. The schema itself is
documented in :mod:`edge_sdk.bundle`; :mod:`.input_spec` holds the input spec,
:mod:`.configuration` a configuration and :mod:`.manifest` the whole manifest.

stdlib only.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from edge_sdk.errors import BundleError
from edge_sdk.validation import (
    choice,
    fail,
    got,
    int_value,
    join,
    list_value,
    mapping,
    show,
    str_value,
)

SCHEMA_VERSION = 10  # what the exporter writes
# what this edge_sdk reads: 1 = batch-1 slices (no batch_dim), 2 = batch_dim recorded,
# 3 = bundle layouts (files | store: one weight store, slices materialised; docs/store.md),
# 4 = version 3 whose store configurations and graphs may leave out what the reader derives
# (docs/store.md §5): an edge_sdk that reads only 1..3 refuses it by its version, not by a
# missing key, 5 = version 4 plus ``uncertainty`` (a verified file of
# out-of-distribution statistics and conformal quantiles; slices with a second output, the
# features it reads); an older bundle loads without them (ood_score None, no set), 6 = version
# 5 plus ``input_stats`` (the training split's per-channel raw statistics; an older
# bundle answers input_suspect None), 7 = version 6 plus integer configurations (weights
# ``int8``: int8 kernels end to end) and, layout store, ``activation_quant``: the int8
# activations' scale and zero point per width, which the device's materialiser reads,
# 8 = version 7 plus a cascade plan per target accuracy (``targets`` in a cascade entry; an
# older bundle's one plan serves every target), 9 = version 8 plus ``input.preprocess`` (a
# photo model's evaluation transform, edge_sdk.bundle.preprocess: the runtime resizes and
# crops image files and uint8 arrays of any size by it; an older bundle takes its input shape),
# 10 = version 9 plus a configuration's ``val_accuracy`` (the accuracy of its validation
# predictions, which the device rules compare; an older bundle loads with None and the rules
# fall back to the test accuracy)
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
MANIFEST_NAME = "manifest.yaml"
SIGNATURE_NAME = MANIFEST_NAME + ".sig"  # a signed bundle's Ed25519 signature (docs/signing.md)
FILE_SUFFIX = ".tflite"
STORE_SUFFIX = ".bin"  # the weight store's file (docs/store.md §1)
BUNDLE_LAYOUTS = ("files", "store")  # schema version 3's `layout` (older versions: files)

LAYOUTS = ("NHWC",)
INPUT_DTYPES = ("float32", "uint8")
SCOPES = ("point", "head", "all")
# how a slice computes: dequantize (int8 weights expanded once) and float run float32 kernels,
# hybrid int8 weights with dynamically quantized activations, int8 (schema version 7) int8
# kernels with activations calibrated per width (edge_sdk.tflite.integer)
WEIGHT_ROUTES = ("dequantize", "hybrid", "float", "int8")
#: route -> the precision it computes in (what the policy and the tables show)
PRECISION = {"dequantize": "float", "float": "float", "hybrid": "dynamic", "int8": "int8"}
OUTPUT_KINDS = ("logits",)

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def _file_name(value: object, path: str, suffix: str = FILE_SUFFIX) -> str:
    """A plain ``*.tflite`` (or ``suffix``) file name that can only refer to a file directly
    inside the bundle."""
    name = str_value(value, path)
    expected = f"a plain file name ending in {suffix!r}"
    if "/" in name or "\\" in name or (os.altsep and os.altsep in name):
        fail(path, f"expected {expected} (no path separators), got {show(name)}")
    if name in (".", ".."):
        fail(path, f"expected {expected}, got {show(name)}")
    if name.startswith("."):
        fail(path, f"expected {expected} not starting with '.', got {show(name)}")
    if ":" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        fail(path, f"expected {expected} without ':' or control characters, got {show(name)}")
    if not name.endswith(suffix):
        fail(path, f"expected {expected}, got {show(name)}")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        fail(path, f"expected {expected} in valid UTF-8, got {show(name)}")
    if len(encoded) > 255:
        fail(path, f"expected {expected} of at most 255 bytes, got {len(encoded)} bytes")
    return name



def _to_plain(value: object) -> Any:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value



_R = TypeVar("_R", bound="_Record")


class _Record:
    """Frozen-dataclass mixin: validate and normalise on construction, dict round trip.

    Subclasses implement ``_parse(values, path) -> normalised values``; it raises
    :class:`BundleError` naming ``path`` plus the key. ``from_dict`` calls it once with the real
    dotted path and builds the record from its output without running it again;
    ``__post_init__`` runs it (with the class name as the path) so a record constructed
    directly in Python is held to the same rules.
    """

    if TYPE_CHECKING:  # every subclass is a dataclass: what dataclasses.fields() wants
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in self._parse(values, type(self).__name__).items():
            object.__setattr__(self, name, value)

    @classmethod
    def _parse(cls, values: dict[str, Any], path: str) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls: type[_R], data: Mapping[str, Any], path: str = "") -> _R:
        """Build from plain data (e.g. parsed YAML); ``path`` prefixes error key paths."""
        data = mapping(data, path)
        names = [f.name for f in fields(cls)]
        unknown = [k for k in data if k not in names]
        if unknown:
            fail(
                path,
                f"unknown key(s) {', '.join(show(k) for k in unknown)}; "
                f"expected keys: {', '.join(names)}",
            )
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in data:
                values[f.name] = data[f.name]
            elif f.default is not MISSING:
                values[f.name] = f.default
            elif f.default_factory is not MISSING:
                values[f.name] = f.default_factory()
            else:
                fail(join(path, f.name), "missing required key")
        values.update(cls._parse(values, path))
        # Already validated and normalised: set the fields directly instead of cls(**values),
        # whose __post_init__ would parse everything a second time (a large store manifest
        # spent half its load time there).
        record = object.__new__(cls)
        for name, value in values.items():
            object.__setattr__(record, name, value)
        return record

    def to_dict(self) -> dict[str, Any]:
        """Plain data (dicts, lists, scalars) in schema key order; a deep copy."""
        return {f.name: _to_plain(getattr(self, f.name)) for f in fields(self)}


def _record(cls: type[_R], value: object, path: str) -> _R:
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls.from_dict(value, path)
    fail(path, f"expected a mapping ({cls.__name__}), {got(value)}")


@dataclass(frozen=True)
class FileEntry(_Record):
    """One file of the bundle: a plain ``*.tflite`` name, its sha256 (hex) and size in bytes."""

    name: str
    sha256: str
    bytes: int

    _suffix = FILE_SUFFIX  # a class constant, not a field

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        name = _file_name(v["name"], join(path, "name"), cls._suffix)
        sha = v["sha256"]
        if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
            fail(join(path, "sha256"), f"expected 64 hex characters (lowercase), got {show(sha)}")
        size = int_value(v["bytes"], join(path, "bytes"), minimum=1)
        return {"name": name, "sha256": str(sha), "bytes": size}


@dataclass(frozen=True)
class StoreEntry(FileEntry):
    """The weight store of a ``layout: store`` bundle (docs/store.md §1): a plain ``*.bin``
    name, its sha256 (hex) and size in bytes; read once and verified at load."""

    _suffix = STORE_SUFFIX


def file_entry(name: str, data: bytes | bytearray | memoryview,
               cls: type[FileEntry] | None = None
               ) -> FileEntry:
    """The :class:`FileEntry` (a ``*.bin`` name, or ``cls=StoreEntry``: the
    :class:`StoreEntry`) for ``data`` stored under ``name`` (computes sha256 and size)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BundleError(f"file_entry({name!r}): expected bytes, {got(data)}")
    if cls is None:
        cls = StoreEntry if isinstance(name, str) and name.endswith(STORE_SUFFIX) else FileEntry
    blob = bytes(data)
    return cls(name=name, sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))


_WIDTH_KEY_RE = re.compile(r"(0\.[0-9]{2}|1\.00)")


def width_key(width: float) -> str:
    """A width as the store and the manifest's ``graphs`` key it (docs/store.md §2): ``%.2f``."""
    return f"{float(width):.2f}"


def _width_key(value: object, path: str) -> str:
    key = str_value(value, path)
    if not _WIDTH_KEY_RE.fullmatch(key) or key == "0.00":
        fail(path, f"expected a width key such as '0.50' (the width as %.2f, in (0, 1]), got "
                   f"{show(key)}")
    return key


@dataclass(frozen=True, kw_only=True)
class Recipe(_Record):
    """How one (virtual) file of a ``layout: store`` configuration is materialised from the
    store (docs/store.md §3): the width's graph (``width``, a key of the manifest's
    ``graphs``), the posterior sample (``sample``: None = the point network; all scope: the
    sample index) and ``heads`` (0; head scope: S sampled classifiers stacked, output [S, C])."""

    width: str
    sample: int | None = None
    heads: int = 0

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        width = _width_key(v["width"], join(path, "width"))
        sample = v["sample"]
        if sample is not None:
            sample = int_value(sample, join(path, "sample"), minimum=0)
        heads = int_value(v["heads"], join(path, "heads"), minimum=0)
        if heads and sample is not None:
            fail(join(path, "sample"), f"expected null with heads={heads} (a head slice stacks "
                                       f"samples 0..{heads - 1} itself), got {sample}")
        return {"width": width, "sample": sample, "heads": heads}


@dataclass(frozen=True, kw_only=True)
class Slice(_Record):
    """One virtual file of a ``layout: store`` bundle, in the manifest's top-level ``slices``
    table (keyed by its ``*.tflite`` name; docs/store.md §5): the sha256 and size of its
    materialised bytes and its recipe (``width``, ``sample``, ``heads``: :class:`Recipe`).
    Configurations list their files by name; the manifest resolves each name to its
    :class:`FileEntry` and :class:`Recipe` when it is read, so a file shared by several
    configurations (all-S lists the first S sample files) is described once."""

    sha256: str
    bytes: int
    width: str
    sample: int | None = None
    heads: int = 0

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        sha = v["sha256"]
        if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
            fail(join(path, "sha256"), f"expected 64 hex characters (lowercase), got {show(sha)}")
        size = int_value(v["bytes"], join(path, "bytes"), minimum=1)
        recipe = Recipe._parse({k: v[k] for k in ("width", "sample", "heads")}, path)
        return {"sha256": str(sha), "bytes": size, **recipe}

    def entry(self, name: str) -> FileEntry:
        """The :class:`FileEntry` of this slice under ``name``."""
        return FileEntry(name=name, sha256=self.sha256, bytes=self.bytes)

    @property
    def recipe(self) -> Recipe:
        return Recipe(width=self.width, sample=self.sample, heads=self.heads)

    def to_dict(self, compact: bool = False) -> dict[str, Any]:
        """Plain data; ``compact``: ``sample`` and ``heads`` left out at their defaults."""
        out = super().to_dict()
        if compact:
            if out["sample"] is None:
                del out["sample"]
            if out["heads"] == 0:
                del out["heads"]
        return out


@dataclass(frozen=True, kw_only=True)
class OutputSpec(_Record):
    """The output tensor of a configuration's file(s): ``[1, C]``, or ``[S, C]`` for head scope."""

    kind: str = "logits"
    shape: tuple[int, int]

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        kind = choice(v["kind"], join(path, "kind"), OUTPUT_KINDS)
        p = join(path, "shape")
        shape = tuple(
            int_value(x, f"{p}[{i}]", minimum=1) for i, x in enumerate(list_value(v["shape"], p, length=2))
        )
        return {"kind": kind, "shape": shape}


