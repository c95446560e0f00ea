"""Just enough of a ``.tflite`` file to know what a backend will be asked to run: each operator's
builtin code and version, and the type and quantization of its input tensors.

The device install has neither TensorFlow's nor LiteRT's flatbuffer schema (tflite-runtime ships
none, and ``flatbuffers`` is not a dependency), so this reads the few tables it needs straight
from the bytes, stdlib only. Field numbers are those of TensorFlow Lite's ``schema.fbs``:

    Model          operator_codes: 1, subgraphs: 2
    OperatorCode   deprecated_builtin_code: 0 (int8), version: 2 (int32, default 1),
                   builtin_code: 3 (int32; the larger of the two codes is the real one)
    SubGraph       tensors: 0, inputs: 1 ([int32]), outputs: 2 ([int32]), operators: 3
    Tensor         shape: 0 ([int32]), type: 1 (int8 TensorType), quantization: 4,
                   shape_signature: 7 ([int32], -1 = a dimension resizable at run time)
    Quantization   scale: 2 ([float32]), quantized_dimension: 6 (int32)
    Operator       opcode_index: 0 (uint32), inputs: 1 ([int32], -1 = optional input left out)
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from edge_sdk.errors import BundleError

# BuiltinOperator values this runtime reasons about (schema.fbs)
CONV_2D, DEPTHWISE_CONV_2D, DEQUANTIZE, FULLY_CONNECTED = 3, 4, 6, 9
# TensorType values
TENSOR_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "string",
                6: "bool", 7: "int16", 8: "complex64", 9: "int8", 10: "float64"}
OP_NAMES = {CONV_2D: "CONV_2D", DEPTHWISE_CONV_2D: "DEPTHWISE_CONV_2D", DEQUANTIZE: "DEQUANTIZE",
            FULLY_CONNECTED: "FULLY_CONNECTED"}


@dataclass(frozen=True)
class TensorInfo:
    type: str  # TENSOR_TYPES name ("int8", "float32", ...)
    scales: int  # number of quantization scales (0: not quantized, >1: per channel)


@dataclass(frozen=True)
class OpInfo:
    code: int  # BuiltinOperator
    version: int
    inputs: tuple[TensorInfo | None, ...]  # None: an optional input left out

    @property
    def name(self) -> str:
        return OP_NAMES.get(self.code, f"builtin {self.code}")


class _Reader:
    """Flatbuffer tables, vectors and scalars over a bytes object (little-endian)."""

    def __init__(self, buf: bytes, what: str):
        self.buf, self.what = buf, what

    def _unpack(self, fmt: str, pos: int) -> int:
        """The integer (``fmt`` one of the integer formats) at ``pos``."""
        try:
            value: int = struct.unpack_from(fmt, self.buf, pos)[0]
            return value
        except struct.error as e:
            raise BundleError(f"{self.what}: not a valid TFLite flatbuffer (reading offset {pos}: "
                              f"{e})") from None

    def root(self) -> int:
        if self.buf[4:8] != b"TFL3":
            raise BundleError(f"{self.what}: not a TFLite model (file identifier "
                              f"{bytes(self.buf[4:8])!r}, expected b'TFL3')")
        return self._unpack("<I", 0)

    def _field(self, table: int, index: int) -> int:
        """Absolute position of field ``index`` of ``table``, 0 when absent."""
        vtable = table - self._unpack("<i", table)
        if 4 + 2 * index >= self._unpack("<H", vtable):
            return 0
        off = self._unpack("<H", vtable + 4 + 2 * index)
        return table + off if off else 0

    def scalar(self, table: int, index: int, fmt: str, default: int) -> int:
        pos = self._field(table, index)
        return self._unpack(fmt, pos) if pos else default

    def ref(self, table: int, index: int) -> int:
        """The table or vector a reference field points to, 0 when absent."""
        pos = self._field(table, index)
        return pos + self._unpack("<I", pos) if pos else 0

    def length(self, vector: int, item: int = 1) -> int:
        """Element count of ``vector``, refused when its ``item``-byte elements would run past
        the end of the file (a truncated or forged file must fail here, in Python, not inside
        an interpreter that trusts it: tflite-runtime 2.14 segfaults on a truncated model)."""
        if not vector:
            return 0
        n = self._unpack("<I", vector)
        if vector + 4 + n * item > len(self.buf):
            raise BundleError(f"{self.what}: not a valid TFLite flatbuffer (a vector of {n} "
                              f"items at offset {vector} runs past the end of the "
                              f"{len(self.buf)}-byte file: truncated?)")
        return n

    def tables(self, vector: int) -> list[int]:
        out = []
        for i in range(self.length(vector, 4)):
            pos = vector + 4 + 4 * i
            out.append(pos + self._unpack("<I", pos))
        return out

    def ints(self, vector: int) -> list[int]:
        return [self._unpack("<i", vector + 4 + 4 * i) for i in range(self.length(vector, 4))]

    def check_buffers(self, model: int) -> None:
        """Every constant buffer's bytes lie inside the file (Model.buffers = field 4; Buffer
        .data = field 0, or .offset/.size = fields 1/2 for data stored after the flatbuffer)."""
        for b in self.tables(self.ref(model, 4)):
            self.length(self.ref(b, 0))
            offset, size = self.scalar(b, 1, "<Q", 0), self.scalar(b, 2, "<Q", 0)
            if offset > 1 and offset + size > len(self.buf):
                raise BundleError(f"{self.what}: not a valid TFLite flatbuffer (a buffer at "
                                  f"offset {offset} of {size} bytes runs past the end of the "
                                  f"{len(self.buf)}-byte file: truncated?)")


def read_ops(data: bytes, what: str = "model") -> list[OpInfo]:
    """Every operator of every subgraph, in order. Raises BundleError on a malformed file."""
    r = _Reader(data, what)
    model = r.root()
    codes = []
    for oc in r.tables(r.ref(model, 1)):
        deprecated = r.scalar(oc, 0, "<b", 0)
        builtin = r.scalar(oc, 3, "<i", 0)
        codes.append((max(deprecated, builtin), r.scalar(oc, 2, "<i", 1)))
    ops = []
    for sg in r.tables(r.ref(model, 2)):
        tensors = []
        for t in r.tables(r.ref(sg, 0)):
            q = r.ref(t, 4)
            scales = r.length(r.ref(q, 2)) if q else 0
            type_id = r.scalar(t, 1, "<b", 0)
            tensors.append(TensorInfo(TENSOR_TYPES.get(type_id, f"type {type_id}"), scales))
        for op in r.tables(r.ref(sg, 3)):
            index = r.scalar(op, 0, "<I", 0)
            if index >= len(codes):
                raise BundleError(f"{what}: operator code index {index} out of range "
                                  f"({len(codes)} codes)")
            ins = []
            for i in r.ints(r.ref(op, 1)):
                if i >= len(tensors):
                    raise BundleError(f"{what}: tensor index {i} out of range "
                                      f"({len(tensors)} tensors)")
                ins.append(tensors[i] if i >= 0 else None)
            ops.append(OpInfo(*codes[index], tuple(ins)))
    return ops


@dataclass(frozen=True)
class IOTensor:
    """A graph input or output of the main subgraph: its shape, type and, when the file has
    one, its shape signature (``-1`` marks a dimension the interpreter may resize)."""

    index: int
    shape: tuple[int, ...]
    type: str
    shape_signature: tuple[int, ...] | None


# a rank above this is no tensor a classifier runs: refuse before walking a hostile vector
_MAX_RANK = 16
_MAX_IO = 64


def read_io(data: bytes, what: str = "model") -> tuple[list[IOTensor], list[IOTensor]]:
    """(inputs, outputs) of the first subgraph (the one an interpreter runs). Raises
    BundleError naming ``what`` on a malformed file or one without a subgraph."""
    r = _Reader(data, what)
    model = r.root()
    r.check_buffers(model)
    read_ops(data, what)  # walks every operator and tensor: bounds-checked before any interpreter
    subgraphs = r.tables(r.ref(model, 2))
    if not subgraphs:
        raise BundleError(f"{what}: the model has no subgraph")
    sg = subgraphs[0]
    tensors = r.tables(r.ref(sg, 0))

    def tensor(i: int) -> IOTensor:
        if not 0 <= i < len(tensors):
            raise BundleError(f"{what}: graph input/output tensor index {i} out of range "
                              f"({len(tensors)} tensors)")
        t = tensors[i]
        dims = []
        for field in (0, 7):
            vec = r.ref(t, field)
            if r.length(vec) > _MAX_RANK:
                raise BundleError(f"{what}: tensor {i} has rank {r.length(vec)}, more than "
                                  f"{_MAX_RANK}")
            dims.append(tuple(r.ints(vec)) if vec else None)
        type_id = r.scalar(t, 1, "<b", 0)
        return IOTensor(i, dims[0] or (), TENSOR_TYPES.get(type_id, f"type {type_id}"), dims[1])

    io = []
    for field, kind in ((1, "inputs"), (2, "outputs")):
        vec = r.ref(sg, field)
        if r.length(vec) > _MAX_IO:
            raise BundleError(f"{what}: {r.length(vec)} graph {kind}, more than {_MAX_IO}")
        io.append([tensor(i) for i in r.ints(vec)])
    return io[0], io[1]


def read_ops_file(path: str | Path) -> list[OpInfo]:
    p = Path(path)
    return read_ops(p.read_bytes(), p.name)
