"""Bit packing of codebook indices (docs/store.md section 2).

A layer's weights are stored as indices into a small sorted codebook of K values. An index
needs ``ceil(log2 K)`` bits, so a 16-entry codebook costs 4 bits a weight instead of 8 (int8) or
32 (float32). The stream format is the simplest one with no per-platform choice in it:

- value ``i`` occupies bits ``[i * bits, (i + 1) * bits)`` of the stream;
- bit ``b`` of the stream is bit ``b % 8`` (least significant first) of byte ``b // 8``
  (little-endian bit order, the one ``np.packbits(bitorder="little")`` writes);
- the stream is ``ceil(count * bits / 8)`` bytes; the padding bits of the last byte are zero,
  and the reader refuses non-zero padding (one canonical encoding per index array, so the
  store's sha256 pins the values).

``bits = 0`` (K = 1: every weight is the one codebook value) stores no bytes at all.

Everything is vectorised numpy (whole-array bit planes, ``packbits`` and one gather per
value; Python loops only over the <= 32 bit positions). Unpacking has fast paths for the
widths that split bytes evenly: 8, 16 and 32 bits are the integers themselves, 1 bit is
``unpackbits``, 2 and 4 bits one strided pass per value position of a byte (4: the nibble
split). 2.4 M indices unpack in ~0.7 ms at 4 bits (2 bits the same, 1 bit ~0.2 ms) against
~25 ms for the general gather the other widths use; packing takes ~10 ms at 4 bits (2-core x86
workstation, numpy 2.4).
"""
from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import BundleError, ConfigError

__all__ = ["MAX_BITS", "bits_for", "packed_size", "pack_bits", "unpack_bits", "unpack_lookup",
           "pack_mask", "unpack_mask"]

MAX_BITS = 32  # indices are read back as uint16 (bits <= 16) or uint32


def bits_for(k: int) -> int:
    """Bits per index for a codebook of ``k`` entries: ``ceil(log2 k)``.

    ``k = 1`` -> 0 (nothing stored), 2 -> 1, ``2**b`` -> ``b``, ``2**b + 1`` -> ``b + 1``.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"codebook size must be an integer >= 1, got {k!r}")
    bits = (int(k) - 1).bit_length()
    if bits > MAX_BITS:
        raise ConfigError(f"codebook size {k} needs {bits} bits per index, at most {MAX_BITS}")
    return bits


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) \
            or not 0 <= bits <= MAX_BITS:
        raise ConfigError(f"bits per index must be an integer in [0, {MAX_BITS}], got {bits!r}")
    return int(bits)


def packed_size(count: int, bits: int) -> int:
    """Bytes of ``count`` indices packed at ``bits`` bits: ``ceil(count * bits / 8)``."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ConfigError(f"index count must be an integer >= 0, got {count!r}")
    return (int(count) * _check_bits(bits) + 7) // 8


_S = TypeVar("_S", bound=np.generic)
# what unpack_bits returns: uint16 up to 16 bits, else uint32
Indices = npt.NDArray[np.unsignedinteger[Any]]
# packed bytes: from a file, or a store's uint8 array (anything np.frombuffer reads)
Packed = bytes | bytearray | memoryview | npt.NDArray[np.uint8]


def pack_bits(indices: npt.ArrayLike, bits: int) -> bytes:
    """Pack non-negative integer ``indices`` (any shape, read in C order) at ``bits`` bits each.

    Refuses (``ConfigError``) a non-integer array, a negative value and a value ``>= 2**bits``:
    a silently truncated index would decode to another codebook entry.
    """
    bits = _check_bits(bits)
    values = np.asarray(indices)
    if values.dtype.kind not in "ui" and not (values.dtype == bool):
        raise ConfigError(f"indices must be an integer array, got dtype {values.dtype}")
    flat = values.reshape(-1)
    if flat.size == 0:
        return b""
    lo, hi = int(flat.min()), int(flat.max())
    if lo < 0 or hi >= (1 << bits):
        bad = lo if lo < 0 else hi
        raise ConfigError(f"index {bad} does not fit in {bits} bits: values must be in "
                          f"[0, {(1 << bits) - 1}]")
    if bits == 0:
        return b""
    if bits <= 12:  # one pass per bit plane: the fast path for codebooks (up to 4096 entries)
        words = flat.astype(np.uint32)
        rows = np.empty((flat.size, bits), dtype=np.uint8)
        for j in range(bits):
            np.bitwise_and(words >> j, 1, out=rows[:, j], casting="unsafe")
    else:  # each value as 4 little-endian bytes -> 32 bits LSB first; keep the low `bits`
        le_bytes = flat.astype("<u4").view(np.uint8).reshape(-1, 4)
        rows = np.unpackbits(le_bytes, axis=1, bitorder="little")[:, :bits]
    return np.packbits(rows.reshape(-1), bitorder="little").tobytes()


def _packed_bytes(buf: Packed, bits: int,
                  count: int) -> npt.NDArray[np.uint8]:
    """``buf`` as uint8, refused (``BundleError``) unless it is exactly ``ceil(count * bits / 8)``
    bytes with zero padding bits."""
    expected = packed_size(count, bits)
    raw = np.frombuffer(buf, dtype=np.uint8)
    if raw.size != expected:
        raise BundleError(f"packed indices: expected {expected} bytes for {count} values at "
                          f"{bits} bits, got {raw.size} bytes")
    if raw.size:
        used = count * bits - 8 * (raw.size - 1)  # bits of the last byte that hold values
        if int(raw[-1]) >> used:
            raise BundleError(f"packed indices: padding bits after {count} values at {bits} "
                              f"bits must be zero (the canonical encoding), got non-zero")
    return raw


def unpack_bits(buf: Packed, bits: int, count: int) -> Indices:
    """The ``count`` indices packed in ``buf`` at ``bits`` bits each, as a new 1-D array.

    dtype uint16 for ``bits <= 16``, else uint32. Refuses (``BundleError``) a buffer that is not
    exactly ``ceil(count * bits / 8)`` bytes, or whose padding bits are not zero.
    """
    bits = _check_bits(bits)
    raw = _packed_bytes(buf, bits, count)
    dtype: type[np.unsignedinteger[Any]] = np.uint16 if bits <= 16 else np.uint32
    if count == 0 or bits == 0:
        return np.zeros(count, dtype=dtype)
    if bits in (8, 16, 32):  # whole bytes: the stream is the little-endian integers themselves
        return raw.view(f"<u{bits // 8}").astype(dtype)
    if bits == 1:
        return np.unpackbits(raw, count=count, bitorder="little").astype(dtype)
    if bits in (2, 4):
        return _unpack_sub_byte(raw, bits, count)
    return _unpack_gather(raw, bits, count, dtype)


def unpack_lookup(buf: Packed, bits: int, count: int,
                  table: npt.NDArray[_S]) -> npt.NDArray[_S]:
    """``table[unpack_bits(buf, bits, count)]``: the ``table`` entries (a 1-D array, e.g. a
    codebook) the ``count`` packed indices select, a 1-D array of ``table``'s dtype. Refuses
    (``BundleError``) what :func:`unpack_bits` refuses and an index ``>= len(table)``.

    At 1, 2 and 4 bits a byte holds whole indices, so the entries of all 256 byte values are
    tabulated (``(256, 8 // bits)``) and each byte gathers its row: one gather of ``count * bits
    / 8`` rows instead of an unpack and a gather per index (2.4 M indices at 4 bits: ~0.9 ms
    against ~3 ms)."""
    table = np.asarray(table)
    if table.ndim != 1:
        raise ConfigError(f"lookup table must be 1-D, got shape {table.shape}")
    bits = _check_bits(bits)
    if bits not in (1, 2, 4) or count == 0:
        idx = unpack_bits(buf, bits, count)
        if idx.size and int(idx.max()) >= table.size:
            raise BundleError(f"index {int(idx.max())} outside its {table.size}-entry codebook")
        return np.take(table, idx)
    raw = _packed_bytes(buf, bits, count)
    per = 8 // bits
    fields = (np.arange(256)[:, None] >> (np.arange(per) * bits)) & ((1 << bits) - 1)
    if table.size < 1 << bits:  # some index values have no entry: are they used?
        valid = (fields < table.size).all(axis=1)  # byte values whose indices all have one
        if not np.take(valid, raw).all():  # (the zero padding of the last byte is index 0)
            idx = unpack_bits(buf, bits, count)
            raise BundleError(f"index {int(idx.max())} outside its {table.size}-entry codebook")
        fields = np.minimum(fields, table.size - 1)  # rows of the unused byte values
    rows = np.ascontiguousarray(table[fields])  # (256, per): byte b -> its indices' entries
    return np.take(rows, raw, axis=0).reshape(-1)[:count]


def _unpack_sub_byte(raw: npt.NDArray[np.uint8], bits: int, count: int) -> npt.NDArray[np.uint16]:
    """``bits`` in (2, 4): each byte holds ``8 // bits`` whole values, value ``k`` of byte ``b``
    being ``(b >> k * bits) & mask``: one strided pass per value position, straight into the
    uint16 result (4 bits: the nibble split ``b & 15``, ``b >> 4``; 2.4 M indices in ~1 ms
    against ~25 ms for the gather)."""
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    out = np.empty(raw.size * per, dtype=np.uint16)
    np.bitwise_and(raw, mask, out=out[0::per], casting="unsafe")
    if per > 2:
        tmp = np.empty_like(raw)
        for k in range(1, per - 1):
            np.right_shift(raw, k * bits, out=tmp)
            np.bitwise_and(tmp, mask, out=out[k::per], casting="unsafe")
    np.right_shift(raw, (per - 1) * bits, out=out[per - 1::per], casting="unsafe")  # top bits
    return out[:count]


def _unpack_gather(raw: npt.NDArray[np.uint8], bits: int, count: int,
                   dtype: type[np.unsignedinteger[Any]]) -> Indices:
    """Any width: value i starts at bit i*bits, so gather the 4 (5 past 25 bits) bytes from its
    first byte into one integer, shift and mask; the zero tail keeps the last gathers in
    bounds."""
    wt = np.uint64 if bits > 25 else np.uint32
    span = 5 if bits > 25 else 4
    padded = np.zeros(raw.size + span, dtype=np.uint8)
    padded[:raw.size] = raw
    pos = np.arange(count, dtype=np.int64) * bits
    first = pos >> 3
    value = padded[first].astype(wt)
    for k in range(1, span):
        value |= padded[first + k].astype(wt) << wt(8 * k)
    value >>= (pos & 7).astype(wt)
    value &= wt((1 << bits) - 1)
    out: Indices = value.astype(dtype)
    return out


def pack_mask(mask: npt.ArrayLike) -> bytes:
    """A non-zero mask (``mask != 0``, C order) at one bit per element (SQS's exact sparsity)."""
    return pack_bits(np.asarray(mask).reshape(-1) != 0, 1)


def unpack_mask(buf: Packed, count: int) -> npt.NDArray[np.bool_]:
    """The boolean mask of ``count`` elements :func:`pack_mask` wrote (refuses as
    :func:`unpack_bits` does)."""
    return unpack_bits(buf, 1, count).astype(bool)
