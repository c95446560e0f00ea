"""Bounds-checked reads of a flatbuffer held in memory, with a whitelist of the fields each
table may set. What :mod:`edge_sdk.tflite.reader` walks a ``.tflite`` file with.

Why not the ``flatbuffers`` package's Table: it trusts every offset (a forged one reads another
table's bytes, or raises IndexError / struct.error from deep inside), and it cannot say which
fields a table sets. Here every position is checked against the file before it is read (struct
would happily read from the end for a negative one), every vector's length against the bytes
left, and a table setting a field outside its whitelist is refused: an interpreter would act on
a field the reader ignores. Errors are :class:`~edge_sdk.errors.SliceError` naming the file.

stdlib + numpy.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import SliceError

__all__ = ["Flat", "MAX_STRING", "Table"]

MAX_STRING = 4096  # a tensor or signature name; far above any the writer makes


class Flat:
    """Bounds-checked flatbuffer reads over ``data``: every position is checked against the
    file before it is read (struct would happily read from the end for a negative one)."""

    def __init__(self, data: bytes, what: str, fields: Mapping[str, set[int]] | None = None):
        # fields: table kind -> the field numbers it may set (a kind not listed: any)
        self.data, self.what, self.size = data, what, len(data)
        self.fields = fields or {}

    def bad(self, message: str) -> SliceError:
        return SliceError(f"{self.what}: {message}")

    def _read(self, fmt: str, pos: int) -> tuple[Any, ...]:
        n = struct.calcsize(fmt)
        if pos < 0 or pos + n > self.size:
            raise self.bad(f"not a valid TFLite flatbuffer (a {n}-byte read at offset {pos} "
                           f"lies outside the {self.size}-byte file)")
        return struct.unpack_from(fmt, self.data, pos)

    def _at(self, fmt: str, pos: int) -> int:
        """The integer (``fmt`` one of the integer formats: <b <B <H <i <I ...) at ``pos``."""
        value: int = self._read(fmt, pos)[0]
        return value

    def _f32(self, pos: int) -> float:
        value: float = self._read("<f", pos)[0]
        return value

    def table(self, pos: int, kind: str) -> "Table":
        vtable = pos - self._at("<i", pos)
        vsize, tsize = self._at("<H", vtable), self._at("<H", vtable + 2)
        if vsize < 4 or vsize % 2 or vtable + vsize > self.size or pos + tsize > self.size:
            raise self.bad(f"not a valid TFLite flatbuffer ({kind} at offset {pos} has a "
                           f"malformed vtable)")
        fields = {}
        for i in range((vsize - 4) // 2):
            off = self._at("<H", vtable + 4 + 2 * i)
            if off:
                if off < 4 or off >= max(tsize, 4):
                    raise self.bad(f"not a valid TFLite flatbuffer ({kind} field {i} at offset "
                                   f"{off} lies outside its {tsize}-byte table)")
                fields[i] = pos + off
        allowed = self.fields.get(kind)
        if allowed is not None and set(fields) - allowed:
            extra = sorted(set(fields) - allowed)
            raise self.bad(f"{kind} sets field(s) {extra}, which edge-sdk's writer never writes "
                           f"(it sets {sorted(allowed)}): refused, since an interpreter would "
                           "act on them")
        return Table(self, pos, kind, fields)

    def vector(self, pos: int, item: int, what: str, limit: int) -> tuple[int, int]:
        """(first element's position, count) of the vector at ``pos``."""
        n = self._at("<I", pos)
        if n > limit or pos + 4 + n * item > self.size:
            raise self.bad(f"{what}: a vector of {n} items at offset {pos} (at most {limit}, "
                           f"inside the {self.size}-byte file)")
        return pos + 4, n


@dataclass
class Table:
    flat: Flat
    pos: int
    kind: str
    fields: dict[int, int]

    def scalar(self, slot: int, fmt: str, default: int) -> int:
        """An integer field (``fmt``: its struct format), ``default`` when absent."""
        pos = self.fields.get(slot)
        return default if pos is None else self.flat._at(fmt, pos)

    def f32(self, slot: int, default: float) -> float:
        """A float32 field, ``default`` when absent."""
        pos = self.fields.get(slot)
        return default if pos is None else self.flat._f32(pos)

    def ref(self, slot: int) -> int | None:
        pos = self.fields.get(slot)
        return None if pos is None else pos + self.flat._at("<I", pos)

    def sub(self, slot: int, kind: str) -> "Table | None":
        pos = self.ref(slot)
        return None if pos is None else self.flat.table(pos, kind)

    def tables(self, slot: int, kind: str, limit: int) -> list["Table"]:
        pos = self.ref(slot)
        if pos is None:
            return []
        start, n = self.flat.vector(pos, 4, f"{self.kind}.{kind}s", limit)
        return [self.flat.table(start + 4 * i + self.flat._at("<I", start + 4 * i), kind)
                for i in range(n)]

    def array(self, slot: int, dtype: str, limit: int) -> npt.NDArray[Any] | None:
        pos = self.ref(slot)
        if pos is None:
            return None
        dt = np.dtype(dtype).newbyteorder("<")
        start, n = self.flat.vector(pos, dt.itemsize, f"{self.kind} field {slot}", limit)
        return np.frombuffer(self.flat.data, dt, n, start).astype(dt.newbyteorder("="))

    def string(self, slot: int) -> str | None:
        pos = self.ref(slot)
        if pos is None:
            return None
        start, n = self.flat.vector(pos, 1, f"{self.kind} string", MAX_STRING)
        try:
            return self.flat.data[start:start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise self.flat.bad(f"{self.kind}: a name that is not UTF-8") from None
