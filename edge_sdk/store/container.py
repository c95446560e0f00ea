"""The ``store.bin`` container (docs/store.md sections 1-2): a JSON index plus named arrays.

Two versions, both read by :func:`decode_store`. Version 1, the store itself (all integers
little-endian)::

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

Version 2 (``COMPRESSED_VERSION``), a deflate-compressed version 1::

    b"EDGESTOR"            8 bytes magic
    u32 version            2
    u64 inner_length       bytes of the version-1 encoding inside (at most MAX_INNER_BYTES)
    stream                 one zlib stream (RFC 1950, level 9) of the complete version-1
                           encoding, nothing after it

Why: the store's int8 codes, 4-bit sigma indices and float16 sample folds are far from random
bytes. Measured on the digits demo stores (4 widths, point + head + all, S_max = 8): Gaussian
254,432 -> 187,035 B, PWFN 237,344 -> 141,163 B, which is what brings those bundles under
the 1.6x of the full-width point slice's ``.tflite`` (1.80x / 1.69x -> 1.37x / 1.08x). The
exporter writes version 2 whenever it is smaller (``encode_store(compress=True)``); version 1
stays the default of :func:`encode_store` and is read as before. Integrity: a bundle's manifest
lists the sha256 of the file's bytes, the *compressed* ones, and the reader checks it before a
byte is decompressed (``edge_sdk.store.sources.read_store``); zlib's adler32 of the
inflated bytes is a second check. Decompression is bounded: never more than ``inner_length``
+ 1 bytes are produced, a declared length above ``MAX_INNER_BYTES`` is refused before any
work, and a truncated stream, bytes after it, a length other than the declared one or a
nested version 2 are refused (``BundleError``). The arrays are read-only zero-copy views into
the one inflated buffer, so a device holds the decompressed store once (``Store.nbytes``: its
size, the store's resident bytes, whatever the file's). Deterministic for a given zlib build
(the sha256 is taken over what the exporter wrote; nothing re-compresses on the device).
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import BundleError, ConfigError

__all__ = ["MAGIC", "FORMAT_VERSION", "COMPRESSED_VERSION", "READABLE_VERSIONS",
           "MAX_INNER_BYTES", "ALIGN", "DTYPES", "Store", "compress_store", "encode_store",
           "decode_store"]

MAGIC = b"EDGESTOR"
FORMAT_VERSION = 1  # the store itself (header + aligned arrays)
COMPRESSED_VERSION = 2  # one zlib stream of a complete version-1 encoding
READABLE_VERSIONS = (FORMAT_VERSION, COMPRESSED_VERSION)
#: the largest inflated (version-1) store a version-2 file may declare: 1 GiB, far above any
#: edge model's store (the digits demo's is 254 KB), so a hostile length cannot make the
#: reader allocate without bound
MAX_INNER_BYTES = 1 << 30
ZLIB_LEVEL = 9
ALIGN = 16
_PREFIX = struct.Struct("<8sIQ")  # magic, version, header length (v1) / inflated length (v2)
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
    arrays: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    #: set by :func:`decode_store`: bytes of the version-1 buffer the arrays are views into,
    #: i.e. what a device holds for this store (the inflated size for a compressed file, not
    #: the file's size); 0 for a store built in memory
    nbytes: int = 0

    def array(self, name: str) -> npt.NDArray[Any]:
        """The array ``name``; ``BundleError`` naming it when the store has none."""
        try:
            return self.arrays[name]
        except KeyError:
            raise BundleError(f"store has no array {name!r} ({len(self.arrays)} arrays; the "
                              f"index refers to one it does not hold)") from None


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def _dtype_str(a: npt.NDArray[Any], name: str) -> str:
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder != "|" else a.dtype
    if dt.str not in DTYPES:
        raise ConfigError(f"store array {name!r}: dtype {a.dtype} is not allowed, expected one "
                          f"of float32, float16, int8, uint8, uint16, int32, uint32")
    return dt.str


def encode_store(store: Store, compress: bool = False) -> bytes:
    """The bytes of ``store``: deterministic (arrays laid out in name order, canonical JSON).
    Version 1 by default; ``compress=True``: version 2, the version-1 bytes deflated
    (:func:`compress_store`). Refuses (``ConfigError``) a non-JSON index, a non-str name and a
    dtype not in ``DTYPES``."""
    data = _encode_v1(store)
    return compress_store(data) if compress else data


def compress_store(data: bytes | bytearray | memoryview) -> bytes:
    """The version-2 file of the version-1 encoding ``data``: prefix (magic, 2, ``len(data)``)
    then one zlib stream of ``data`` at level 9. ``ConfigError`` unless ``data`` starts as a
    version-1 store (a version 2 is never nested) or when it is above ``MAX_INNER_BYTES``."""
    raw = memoryview(data).cast("B")
    if len(raw) < _PREFIX.size or bytes(raw[:8]) != MAGIC \
            or _PREFIX.unpack_from(raw, 0)[1] != FORMAT_VERSION:
        raise ConfigError(f"compress_store: expected the bytes of a version-{FORMAT_VERSION} "
                          f"store (encode_store(store)), got {len(raw)} bytes that are not")
    if len(raw) > MAX_INNER_BYTES:
        raise ConfigError(f"compress_store: {len(raw)} bytes, above the {MAX_INNER_BYTES} a "
                          f"reader accepts")
    return _PREFIX.pack(MAGIC, COMPRESSED_VERSION, len(raw)) + zlib.compress(raw, ZLIB_LEVEL)


def _encode_v1(store: Store) -> bytes:
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


def _check_entry(name: str, e: Any, payload: int) -> tuple[np.dtype[Any], tuple[int, ...], int, int]:
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
    """The :class:`Store` in ``data`` (version 1 or 2), every array a read-only zero-copy view
    into the one version-1 buffer (``data`` itself, or the buffer version 2 inflates to).

    Refuses (``BundleError``, naming the problem and the expectation) a wrong magic or version,
    a header running past the data, header JSON that is not valid UTF-8 JSON of the expected
    shape, an unknown dtype, a shape that disagrees with the byte count, an array outside the
    payload, misaligned or overlapping arrays, and bytes after the last array; for version 2
    also a declared length above ``MAX_INNER_BYTES``, a corrupt, truncated or trailed zlib
    stream, an inflated length other than the declared one and a version 2 inside it.
    """
    buf = _prefixed(data)
    version = _PREFIX.unpack_from(buf, 0)[1]
    if version == COMPRESSED_VERSION:
        buf = _prefixed(_inflate(buf), "store: the inflated store")
        inner = _PREFIX.unpack_from(buf, 0)[1]
        if inner != FORMAT_VERSION:
            raise BundleError(f"store: the compressed store holds a format version {inner} "
                              f"store, expected {FORMAT_VERSION} (one level of compression, "
                              f"never nested)")
    elif version != FORMAT_VERSION:
        raise BundleError(f"store: format version {version}, expected one of "
                          f"{', '.join(map(str, READABLE_VERSIONS))}")
    return _decode_v1(buf)


def _prefixed(data: bytes | bytearray | memoryview, what: str = "store") -> memoryview:
    """``data`` as bytes, checked to start with a prefix carrying the magic."""
    buf = memoryview(data).cast("B")
    if len(buf) < _PREFIX.size:
        raise BundleError(f"{what}: {len(buf)} bytes, shorter than the {_PREFIX.size}-byte "
                          f"prefix")
    magic = _PREFIX.unpack_from(buf, 0)[0]
    if magic != MAGIC:
        raise BundleError(f"{what}: magic {magic!r}, expected {MAGIC!r} (not a store file)")
    return buf


def _inflate(buf: memoryview) -> bytearray:
    """The version-1 bytes of the version-2 file ``buf`` (prefix checked), bounded and streamed
    (a 1 MB store declaring 1 GiB cost 7.6 s and 2.1 GB before its refusal):

    - a declared length above ``MAX_RATIO`` times the stream's is refused before any work
      (real stores inflate 1.3-1.8x; deflate's ceiling is ~1032x, a bomb's ratio);
    - the stream is inflated ``_CHUNK`` output bytes at a time into one buffer of the declared
      length (never a second copy), and the inner prefix is checked as soon as its bytes
      exist, so garbage is refused after the first chunk, not after a gigabyte;
    - at most the declared length + 1 bytes are ever produced (the one more shows a longer
      stream)."""
    inner = _PREFIX.unpack_from(buf, 0)[2]
    if inner > MAX_INNER_BYTES:
        raise BundleError(f"store: compressed store declares {inner} inflated bytes, above the "
                          f"{MAX_INNER_BYTES} accepted (expected a store of at most 1 GiB)")
    stream = buf[_PREFIX.size:]
    if inner > MAX_RATIO * len(stream) + _SLACK:
        raise BundleError(f"store: compressed store declares {inner} inflated bytes from a "
                          f"{len(stream)}-byte stream, a ratio above the {MAX_RATIO}x accepted "
                          f"(stores inflate under 2x; expected at most "
                          f"{MAX_RATIO * len(stream) + _SLACK} bytes)")
    d = zlib.decompressobj()
    try:
        out = bytearray(inner + 1)
        n = 0
        pending: memoryview | bytes = stream  # then the decompressor's unconsumed tail
        while True:
            piece = d.decompress(pending, min(_CHUNK, inner + 1 - n))
            out[n:n + len(piece)] = piece
            n += len(piece)
            pending = d.unconsumed_tail
            if n >= _PREFIX.size and n - len(piece) < _PREFIX.size:
                _prefixed(out[:_PREFIX.size], "store: the inflated store")  # magic, early
            if d.eof or n > inner or (not piece and not pending):
                break
        del out[n:]
    except zlib.error as e:
        raise BundleError(f"store: the compressed stream does not inflate ({e}); expected one "
                          f"zlib stream of {inner} bytes") from None
    except MemoryError:
        raise BundleError(f"store: not enough memory to inflate the {inner} bytes the "
                          "compressed store declares") from None
    if len(out) > inner:
        raise BundleError(f"store: the compressed stream inflates to more than the {inner} "
                          f"bytes the prefix declares (expected exactly {inner})")
    if not d.eof:
        raise BundleError(f"store: the compressed stream is truncated ({len(stream)} bytes "
                          f"inflate to {len(out)} of {inner} without reaching its end)")
    if d.unused_data:
        raise BundleError(f"store: {len(d.unused_data)} bytes after the compressed stream, "
                          f"expected none")
    if len(out) != inner:
        raise BundleError(f"store: the compressed stream inflates to {len(out)} bytes, the "
                          f"prefix declares {inner}")
    return out


# streamed inflation: a megabyte of output at a time, and a ratio cap. Measured
# inflation ratios of real stores: 1.36-1.81x (module docstring); 32x leaves room for stores
# of near-constant arrays and refuses a bomb (1 MB declaring 1 GiB: ~1000x) before any work.
_CHUNK = 1 << 20
MAX_RATIO = 32
_SLACK = 1 << 16  # a tiny store's prefix and header may inflate more than 32x


def _decode_v1(buf: memoryview) -> Store:
    """The version-1 store in ``buf`` (prefix magic and version already checked)."""
    hlen = _PREFIX.unpack_from(buf, 0)[2]
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
    except RecursionError:  # a header nested 200,000 deep
        raise BundleError("store: header JSON is nested too deeply (a store header is a few "
                          "levels deep)") from None
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
    arrays: dict[str, npt.NDArray[Any]] = {}
    for name, (dtype, shape, off, size) in checked.items():
        if size == 0:
            a = np.zeros(shape, dtype=dtype)
        else:
            a = np.frombuffer(buf, dtype=dtype, count=size // dtype.itemsize,
                              offset=start + off).reshape(shape)
        a.flags.writeable = False
        arrays[name] = a
    return Store(index=header["index"], arrays=arrays, nbytes=len(buf))
