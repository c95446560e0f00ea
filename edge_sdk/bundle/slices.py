"""Verified slice bytes: what an interpreter is built from.

Only verified bytes ever run. :func:`read_slices` reads every file of a bundle **once**, checks
its size and sha256 on those very bytes (:func:`verify_bytes`) and that it is a TFLite model
whose input and output tensors are the ones the manifest promises (:func:`check_slice`, which
parses the whole graph back first: :mod:`edge_sdk.tflite.reader`); the runtime then builds
interpreters from these bytes (``model_content=``), never from the path again, so a file
swapped after ``load()`` (or re-read after LRU eviction, or in a new thread) cannot run.
Anything that builds an interpreter from bytes made elsewhere (e.g. slices materialised in
memory, :mod:`edge_sdk.store.sources`) calls :func:`verify_bytes` and :func:`check_slice`
on them the same way.

stdlib + numpy (the ``.tflite`` readers: :mod:`edge_sdk.tflite.model_info`,
:mod:`edge_sdk.tflite.reader`).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from edge_sdk.tflite.model_info import IOTensor, read_io
from edge_sdk.bundle.files import PathLike, resolve_file
from edge_sdk.errors import BundleError, ChecksumMismatchError
from edge_sdk.tflite.reader import read_graph
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_sdk.bundle.records import FileEntry
    from edge_sdk.bundle.input_spec import InputSpec
    from edge_sdk.bundle.manifest import Manifest
    from edge_sdk.bundle.configuration import Configuration

__all__ = ["check_slice", "read_slices", "verify_bytes"]

# The model input is always the normalised float32 tensor (InputSpec.dtype is the raw dtype
# the app passes); the output is float32 logits.
MODEL_DTYPE = "float32"


def verify_bytes(data: bytes, entry: FileEntry, where: str = "") -> None:
    """BundleError unless ``data`` has the size and sha256 ``entry`` lists."""
    at = f"{where}: " if where else ""
    if len(data) != entry.bytes:
        raise ChecksumMismatchError(f"{at}file {entry.name!r} has {len(data)} bytes, the "
                                    f"manifest says {entry.bytes} (truncated or modified)")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise ChecksumMismatchError(f"{at}checksum mismatch for {entry.name!r}: manifest "
                                    f"sha256 {entry.sha256}, file sha256 {digest} (corrupted "
                                    "or modified)")


def _describe(t: IOTensor) -> str:
    return f"{t.type} {list(t.shape)}"


def check_slice(data: bytes, name: str, config: Configuration, spec: InputSpec,
                batch_dim: int | None = None, where: str = "") -> None:
    """BundleError naming ``name`` unless ``data`` parses as a TFLite model with one float32
    input of the manifest's input shape and one float32 output of ``config.output.shape``
    (``[S, C]`` for head scope, ``[1, C]`` otherwise). Only the batch dimension (``batch_dim``;
    0 in a version-1 bundle, whose slices still run at batch 1) may be -1 in a shape signature."""
    what = f"{where}: {name}" if where else name
    # the whole graph first: parsed back into the writer's description and checked
    # as the store route checks what it materialises, so no unsound flatbuffer (a shape that
    # lies, an index out of range, a cycle, a NaN constant) ever reaches an interpreter
    read_graph(data, what)
    inputs, outputs = read_io(data, what)
    expect_in = f"{MODEL_DTYPE} {list(spec.shape)}"
    expect_out = f"{MODEL_DTYPE} {list(config.output.shape)}"
    # a second output is the classifier's input features [1, D], which the
    # out-of-distribution score reads; the logits are always the first
    if len(inputs) != 1 or len(outputs) not in (1, 2):
        raise BundleError(
            f"{what}: expected 1 input ({expect_in}) and 1 output ({expect_out}, optionally "
            f"followed by the features {MODEL_DTYPE} [1, D]) for "
            f"configuration {config.id!r}, the model has {len(inputs)} input(s) "
            f"[{', '.join(map(_describe, inputs))}] and {len(outputs)} output(s) "
            f"[{', '.join(map(_describe, outputs))}]")
    (x,), y = inputs, outputs[0]
    if len(outputs) == 2:
        f = outputs[1]
        if f.type != MODEL_DTYPE or len(f.shape) != 2 or f.shape[0] != 1 or f.shape[1] < 1:
            raise BundleError(f"{what}: second output (the features) is {_describe(f)}, "
                              f"expected {MODEL_DTYPE} [1, D] for configuration {config.id!r}")
    if x.type != MODEL_DTYPE or x.shape != tuple(spec.shape):
        raise BundleError(f"{what}: input tensor is {_describe(x)}, the manifest's input needs "
                          f"{expect_in} (a model for another input, or a foreign file)")
    if y.type != MODEL_DTYPE or y.shape != tuple(config.output.shape):
        raise BundleError(
            f"{what}: output tensor is {_describe(y)}, configuration {config.id!r} (scope "
            f"{config.scope!r}, samples={config.samples}, {config.output.shape[1]} classes) "
            f"needs {expect_out}")
    for t, kind in ((x, "input"), *((o, "output") for o in outputs)):
        sig = t.shape_signature
        if sig is None:
            continue
        free = {i for i, d in enumerate(sig) if d == -1}
        fixed_ok = len(sig) == len(t.shape) and all(
            d == s for i, (d, s) in enumerate(zip(sig, t.shape)) if i not in free)
        batch = 0 if batch_dim is None else batch_dim
        if not fixed_ok or free - {batch}:
            raise BundleError(f"{what}: {kind} shape signature {list(sig)} does not fit shape "
                              f"{list(t.shape)}: only dimension {batch} (the batch) may be -1")


def _read_once(path: Path, entry: FileEntry, root: Path) -> bytes:
    """The file's bytes, read once; the size is checked before reading, so a swapped-in huge
    file is refused without being read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != entry.bytes:
                raise ChecksumMismatchError(f"{root}: file {entry.name!r} has {size} bytes, "
                                            f"the manifest says {entry.bytes} (truncated or "
                                            "modified)")
            data = f.read(entry.bytes + 1)  # one more: a file growing while read shows up
    except OSError as exc:
        raise BundleError(f"{root}: cannot read {entry.name!r}: {exc}") from None
    return bytes(data)


def read_verified(bundle_dir: PathLike, entry: FileEntry) -> bytes:
    """One listed file of ``bundle_dir`` read once and verified (size, sha256), e.g. the
    ``uncertainty.bin`` (docs/uncertainty.md)."""
    root = Path(bundle_dir)
    data = _read_once(resolve_file(root, entry.name), entry, root)
    verify_bytes(data, entry, str(root))
    return data


def read_slices(bundle_dir: PathLike, manifest: Manifest) -> dict[str, bytes]:
    """Every file of ``manifest`` in ``bundle_dir``, read once, verified (size, sha256) and
    checked against each configuration that lists it: file name -> immutable bytes."""
    root = Path(bundle_dir)
    if getattr(manifest, "is_store", False):
        store = "its weight store" if manifest.store is None else manifest.store.name
        raise BundleError(f"{root}: a store bundle (layout 'store'): its files are materialised "
                          f"from {store}, not read (edge_sdk.store.sources."
                          f"open_slices, or edge-sdk materialize for a files bundle)")
    blobs: dict[str, bytes] = {}
    for entry in manifest.file_entries():
        data = _read_once(resolve_file(root, entry.name), entry, root)
        verify_bytes(data, entry, str(root))
        blobs[entry.name] = data
    for config in manifest.configurations:
        for entry in config.files:
            check_slice(blobs[entry.name], entry.name, config, manifest.input,
                        manifest.batch_dim, str(root))
    return blobs
