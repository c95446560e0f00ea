"""The ``store.bin`` container (docs/store.md sections 1-2): a JSON index plus named arrays.

Layout (all integers little-endian)::

    b"EDGESTOR"            8 bytes magic
    u32 version            FORMAT_VERSION (1)
    u64 header_length      bytes of the header JSON
    header                 canonical JSON (sorted keys, no spaces, ASCII) of
                           {"index": <anything JSON>, "arrays": {name: {"dtype", "shape",
                                                                        "offset", "bytes"}}}
    zero padding           to the next multiple of 16 (the payload start)
    payload                the arrays, C order, little-endian, each at a 16-aligned
                           ``offset`` relative to the payload start, zero padding between,
                           nothing after the last one (an empty array: offset 0, 0 bytes)

Why this and not ``.npz``: ``encode_store`` is deterministic (same store -> same bytes, so a
manifest's sha256 pins it; zip headers carry timestamps), and ``decode_store`` is zero-copy
(read-only ``np.frombuffer`` views on the one verified buffer: a device holds the store once)
and fully bounds-checked before any view exists: a corrupt or hostile file raises
``BundleError`` naming what was wrong and what was expected, never an IndexError or a view
into the wrong bytes. Offsets are relative to the payload so the header does not depend on its
own length. Only a few plain dtypes are allowed: nothing object-typed, nothing platform-sized.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_sdk.errors import BundleError, ConfigError

__all__ = ["MAGIC", "FORMAT_VERSION", "ALIGN", "DTYPES", "Store", "encode_store", "decode_store"]

MAGIC = b"EDGESTOR"
FORMAT_VERSION = 1
ALIGN = 16
_PREFIX = struct.Struct("<8sIQ")  # magic, version, header length: 20 bytes
# float32, float16, int8, uint8, uint16, int32, uint32 as numpy's little-endian dtype strings
DTYPES = ("<f4", "<f2", "|i1", "|u1", "<u2", "<i4", "<u4")
_ENTRY_KEYS = {"dtype", "shape", "offset", "bytes"}


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Store:
    """A decoded (or to-be-encoded) store: a JSON-able ``index`` describing the layers and
    widths (docs/store.md section 2; its schema is the materialiser's), and the named arrays it
    refers to."""

    index: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def array(self, name: str) -> np.ndarray:
        """The array ``name``; ``BundleError`` naming it when the store has none."""
        try:
            return self.arrays[name]
        except KeyError:
            raise BundleError(f"store has no array {name!r} ({len(self.arrays)} arrays; the "
                              f"index refers to one it does not hold)") from None


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def _dtype_str(a: np.ndarray, name: str) -> str:
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder != "|" else a.dtype
    if dt.str not in DTYPES:
        raise ConfigError(f"store array {name!r}: dtype {a.dtype} is not allowed, expected one "
                          f"of float32, float16, int8, uint8, uint16, int32, uint32")
    return dt.str


def encode_store(store: Store) -> bytes:
    """The bytes of ``store``: deterministic (arrays laid out in name order, canonical JSON).
    Refuses (``ConfigError``) a non-JSON index, a non-str name and a dtype not in ``DTYPES``."""
    if not isinstance(store.index, dict):
        raise ConfigError(f"store index must be a dict, got {type(store.index).__name__}")
    entries: dict[str, dict[str, Any]] = {}
    blobs: list[tuple[int, bytes]] = []
    offset = 0
    for name in sorted(store.arrays):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"store array names must be non-empty str, got {name!r}")
        a = np.asarray(store.arrays[name])
        dt = _dtype_str(a, name)
        blob = np.ascontiguousarray(a, dtype=np.dtype(dt)).tobytes()
        if not blob:  # an empty array occupies nothing: offset 0, the payload end stays put
            entries[name] = {"dtype": dt, "shape": [int(d) for d in a.shape], "offset": 0,
                             "bytes": 0}
            continue
        offset = _align(offset)
        entries[name] = {"dtype": dt, "shape": [int(d) for d in a.shape], "offset": offset,
                         "bytes": len(blob)}
        blobs.append((offset, blob))
        offset += len(blob)
    why = "it does not read back equal (a non-str key, a tuple?)"
    try:
        header = _canonical({"index": store.index, "arrays": entries})
        ok = json.loads(header)["index"] == store.index  # json.dumps turns 1 into "1" silently
    except (TypeError, ValueError) as e:
        ok, why = False, str(e)
    if not ok:
        raise ConfigError(f"store index must be plain JSON (str keys, finite numbers, str, "
                          f"bool, None, lists, dicts): {why}")
    start = _align(_PREFIX.size + len(header))
    out = bytearray(start + offset)
    _PREFIX.pack_into(out, 0, MAGIC, FORMAT_VERSION, len(header))
    out[_PREFIX.size:_PREFIX.size + len(header)] = header
    for off, blob in blobs:
        out[start + off:start + off + len(blob)] = blob
    return bytes(out)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise BundleError(f"store header: duplicate key {k!r} (expected each key once)")
        out[k] = v
    return out


def _check_entry(name: str, e: Any, payload: int) -> tuple[np.dtype, tuple[int, ...], int, int]:
    where = f"store array {name!r}"
    if not isinstance(e, dict) or set(e) != _ENTRY_KEYS:
        got = sorted(e) if isinstance(e, dict) else type(e).__name__
        raise BundleError(f"{where}: expected keys {sorted(_ENTRY_KEYS)}, got {got}")
    if e["dtype"] not in DTYPES:
        raise BundleError(f"{where}: dtype {e['dtype']!r} is not allowed, expected one of "
                          f"{list(DTYPES)}")
    shape, off, size = e["shape"], e["offset"], e["bytes"]
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise BundleError(f"{where}: shape must be a list of integers >= 0, got {shape!r}")
    if not _is_int(off) or off % ALIGN or not _is_int(size):
        raise BundleError(f"{where}: offset must be an integer >= 0 multiple of {ALIGN} and "
                          f"bytes an integer >= 0, got offset {off!r}, bytes {size!r}")
    dtype = np.dtype(e["dtype"])
    count = 1
    for d in shape:
        count *= d
    if count * dtype.itemsize != size:
        raise BundleError(f"{where}: shape {shape} of {e['dtype']} is {count * dtype.itemsize} "
                          f"bytes, the header says {size}")
    if off + size > payload:
        raise BundleError(f"{where}: bytes [{off}, {off + size}) run past the end of the "
                          f"payload ({payload} bytes)")
    return dtype, tuple(shape), off, size


def decode_store(data: bytes | bytearray | memoryview) -> Store:
    """The :class:`Store` in ``data``, every array a read-only zero-copy view into it.

    Refuses (``BundleError``, naming the problem and the expectation) a wrong magic or version,
    a header running past the data, header JSON that is not valid UTF-8 JSON of the expected
    shape, an unknown dtype, a shape that disagrees with the byte count, an array outside the
    payload, misaligned or overlapping arrays, and bytes after the last array.
    """
    buf = memoryview(data).cast("B")
    if len(buf) < _PREFIX.size:
        raise BundleError(f"store: {len(buf)} bytes, shorter than the {_PREFIX.size}-byte prefix")
    magic, version, hlen = _PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        raise BundleError(f"store: magic {magic!r}, expected {MAGIC!r} (not a store file)")
    if version != FORMAT_VERSION:
        raise BundleError(f"store: format version {version}, expected {FORMAT_VERSION}")
    if hlen > len(buf) - _PREFIX.size:
        raise BundleError(f"store: header of {hlen} bytes runs past the end of the data "
                          f"({len(buf) - _PREFIX.size} bytes after the prefix)")
    raw = bytes(buf[_PREFIX.size:_PREFIX.size + hlen])
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        if isinstance(e, BundleError):
            raise
        raise BundleError(f"store: header is not valid UTF-8 JSON ({e})") from None
    if not isinstance(header, dict) or set(header) != {"index", "arrays"} \
            or not isinstance(header["index"], dict) or not isinstance(header["arrays"], dict):
        raise BundleError("store: header must be a JSON object with exactly the keys 'index' "
                          "(an object) and 'arrays' (an object)")
    start = _align(_PREFIX.size + hlen)
    if start > len(buf):
        raise BundleError(f"store: {len(buf)} bytes, the header's padding alone needs {start}")
    if any(buf[_PREFIX.size + hlen:start]):
        raise BundleError("store: the padding after the header must be zero bytes")
    payload = len(buf) - start
    checked = {name: _check_entry(name, e, payload) for name, e in header["arrays"].items()}
    end = 0
    for name, (_, _, off, size) in sorted(checked.items(), key=lambda kv: kv[1][2]):
        if size == 0:
            continue
        if off < end:
            raise BundleError(f"store array {name!r}: bytes [{off}, {off + size}) overlap the "
                              f"previous array (which ends at {end})")
        end = off + size
    if end != payload:
        raise BundleError(f"store: {payload - end} bytes after the last array, expected none "
                          f"(payload {payload} bytes, arrays end at {end})")
    arrays: dict[str, np.ndarray] = {}
    for name, (dtype, shape, off, size) in checked.items():
        if size == 0:
            a = np.zeros(shape, dtype=dtype)
        else:
            a = np.frombuffer(buf, dtype=dtype, count=size // dtype.itemsize,
                              offset=start + off).reshape(shape)
        a.flags.writeable = False
        arrays[name] = a
    return Store(index=header["index"], arrays=arrays)
