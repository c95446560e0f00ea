"""The hostile-bundle corpus of issue 36 and the fork server that runs it (used by
tests/edge_sdk/test_fuzz_corpus.py in CI and by benchmarks/fuzz.py for the larger sweep).

Every case is a bundle directory (or an API call) derived deterministically, from fixed seeds,
from one real exported slice: the session bundle's narrowest point configuration, alone in a
one-configuration bundle (so a case costs one slice's load). The classes mirror the audit
that found the crashes (issue 36 "Why"), each with a minimum count:

- ``byte-fuzz``: 1-8 random bytes of the slice changed, the manifest's sha256 and size
  recomputed to match (half anywhere, half in the flatbuffer's tables, outside the weights);
- ``shape-patch``: one dimension of one tensor's shape changed (-1, +1, 1, 2x), sha256 fixed;
- ``alloc``: what the interpreter refused at allocation: operator input/output indices out of
  range or negative, swapped inputs, self-loops, reshape constants changed, opcode indices;
- ``audit``: the audit's crashing cases as named fixtures (a DEQUANTIZE output's shape shrunk
  in ``fc/weight`` and in a convolution's weight);
- ``manifest``: nesting, alias bombs, numbers float32 cannot carry, duplicate keys;
- ``store``: a store header nested 200,000 deep, zlib bombs, truncated and trailed streams;
- ``api``: bad arguments and inputs (huge numbers, NaN inputs, wrong shapes, ``.npy`` bombs).

Each case runs in a forked child (tests/edge_sdk/fuzz_server.py) and ends as ``refused``,
``answered``, ``nan``, ``raw`` or ``crash``; the promise: 0 crash, 0 raw, 0 nan. This module
builds the slice classes and the whole corpus; tests/edge_sdk/fuzz_inputs.py the others.
"""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_sdk.bundle import read_manifest
from edge_sdk.tflite.flatbuffer import Flat
from fuzz_inputs import api_cases, manifest_cases, store_cases
from fuzz_server import (  # noqa: F401 - the corpus's one import for tests and benchmarks
    OUTCOMES,
    TIME_LIMIT_S,
    Case,
    Result,
    _manifest_text,
    _with_slice,
    _x,
    classify,
    format_table,
    load_and_predict,
    run_case,
    run_corpus,
    run_in_clean_process,
    table,
    write_case,
)

MINIMUMS = {"byte-fuzz": 400, "shape-patch": 150, "alloc": 33, "audit": 2, "manifest": 12,
            "store": 6, "api": 12}


# ------------------------------------------------------------------------- the base bundle
def base_bundle(bundle: Path) -> tuple[dict, bytes, str]:
    """(manifest dict, slice bytes, slice name) of a one-configuration bundle: the session
    bundle's narrowest point configuration."""
    m = read_manifest(bundle)
    point = min((c for c in m.configurations if c.scope == "point"), key=lambda c: c.width)
    data = m.to_dict()
    # the cases hold the manifest and the one slice: without uncertainty.bin (issue 33; its
    # decoder's refusals are tests/edge_sdk/test_uncertainty.py's), a slice's second output
    # is simply unused
    data.pop("uncertainty", None)
    keep = [c for c in data["configurations"] if c["id"] == point.id][0]
    keep["cascade"] = {}
    data["configurations"] = [keep]
    name = point.files[0].name
    return data, (bundle / name).read_bytes(), name


# ------------------------------------------------------------------------ slice anatomy
@dataclass
class Anatomy:
    """Byte positions of what the patches edit, found by walking the flatbuffer."""

    shape_dims: list[tuple[str, int, int]]  # (tensor name, dim index, byte position)
    op_inputs: list[tuple[int, str, int, int]]  # (op index, op name, input slot, position)
    op_outputs: list[tuple[int, int]]  # (op index, position)
    opcode_index: list[tuple[int, int]]  # (op index, position of its opcode_index)
    tensor_count: int
    weight_spans: list[tuple[int, int]]  # [start, end) of every buffer's data
    int32_consts: list[tuple[str, int, int]]  # (tensor name, position, count)
    tensors: list[tuple[str, tuple[int, ...], str]]  # (name, shape, dtype)
    op_names: list[str]
    op_io: list[tuple[list[int], list[int]]]


def anatomy(blob: bytes) -> Anatomy:
    from edge_sdk.tflite.schema import BUILTIN_CODES, TENSOR_TYPES

    code_name = {v: k for k, v in BUILTIN_CODES.items()}
    type_name = {v: k for k, v in TENSOR_TYPES.items()}
    f = Flat(blob, "anatomy")
    model = f.table(f._at("<I", 0), "Model")
    codes = [code_name[oc.scalar(3, "<i", 0)] for oc in model.tables(1, "OperatorCode", 256)]
    buffers = []
    for b in model.tables(4, "Buffer", 1 << 16):
        pos = b.ref(0)
        if pos is None:
            buffers.append(None)
        else:
            n = f._at("<I", pos)
            buffers.append((pos + 4, pos + 4 + n))
    sg = model.tables(2, "SubGraph", 2)[0]
    shape_dims, tensors, int32s = [], [], []
    for t in sg.tables(0, "Tensor", 1 << 16):
        name = t.string(3)
        pos = t.ref(0)
        n = f._at("<I", pos)
        shape = tuple(f._at("<i", pos + 4 + 4 * i) for i in range(n))
        shape_dims += [(name, i, pos + 4 + 4 * i) for i in range(n)]
        dtype = type_name[t.scalar(1, "<b", 0)]
        tensors.append((name, shape, dtype))
        span = buffers[t.scalar(2, "<I", 0)]
        if dtype == "int32" and span:
            int32s.append((name, span[0], (span[1] - span[0]) // 4))
    op_inputs, op_outputs, opcode_index, op_names, op_io = [], [], [], [], []
    for k, o in enumerate(sg.tables(3, "Operator", 1 << 16)):
        op = codes[o.scalar(0, "<I", 0)]
        op_names.append(op)
        if 0 in o.fields:
            opcode_index.append((k, o.fields[0]))
        ins_pos, outs_pos = o.ref(1), o.ref(2)
        ins = [f._at("<i", ins_pos + 4 + 4 * i) for i in range(f._at("<I", ins_pos))]
        outs = [f._at("<i", outs_pos + 4 + 4 * i) for i in range(f._at("<I", outs_pos))]
        op_io.append((ins, outs))
        op_inputs += [(k, op, i, ins_pos + 4 + 4 * i) for i in range(len(ins))]
        op_outputs += [(k, outs_pos + 4)]
    return Anatomy(shape_dims, op_inputs, op_outputs, opcode_index, len(tensors),
                   [s for s in buffers if s], int32s, tensors, op_names, op_io)


def _put_i32(blob: bytes, pos: int, value: int) -> bytes:
    b = bytearray(blob)
    struct.pack_into("<i", b, pos, value)
    return bytes(b)


def _put_u32(blob: bytes, pos: int, value: int) -> bytes:
    b = bytearray(blob)
    struct.pack_into("<I", b, pos, value)
    return bytes(b)


# ------------------------------------------------------------------------------ the classes
def _slice_case(cls: str, name: str, data: dict, slice_name: str, blob: bytes) -> Case:
    x = _x(data)
    classes = len(data["labels"])
    return Case(cls, name, lambda d: classify(load_and_predict(d, x), classes),
                _with_slice(data, slice_name, blob))


# ------------------------------------------------------------------------------ the classes
def byte_fuzz(data: dict, name: str, blob: bytes, n: int, seed: int = 36) -> list[Case]:
    rng = random.Random(seed)
    spans = anatomy(blob).weight_spans
    in_weights = np.zeros(len(blob), bool)
    for a, b in spans:
        in_weights[a:b] = True
    tables = np.flatnonzero(~in_weights)
    out = []
    for i in range(n):
        b = bytearray(blob)
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(len(b)) if i % 2 else int(tables[rng.randrange(len(tables))])
            b[pos] = rng.choice([rng.randrange(256), b[pos] ^ (1 << rng.randrange(8)), 0, 0xFF])
        out.append(_slice_case("byte-fuzz", f"bytes-{i}", data, name, bytes(b)))
    return out


def shape_patches(data: dict, name: str, blob: bytes, limit: int | None = None) -> list[Case]:
    a = anatomy(blob)
    out = []
    for tname, dim, pos in a.shape_dims:
        old = struct.unpack_from("<i", blob, pos)[0]
        for new in sorted({old - 1, old + 1, 1, 2 * old} - {old, 0}):
            out.append(_slice_case("shape-patch", f"{tname}[{dim}]: {old}->{new}", data, name,
                                   _put_i32(blob, pos, new)))
    return out[:limit]


def alloc_cases(data: dict, name: str, blob: bytes) -> list[Case]:
    a = anatomy(blob)
    out = []

    def add(label: str, patched: bytes) -> None:
        out.append(_slice_case("alloc", label, data, name, patched))

    for k, op, slot, pos in a.op_inputs:
        add(f"op {k} {op} input {slot} = -5", _put_i32(blob, pos, -5))
        add(f"op {k} {op} input {slot} = {a.tensor_count + 3}",
            _put_i32(blob, pos, a.tensor_count + 3))
        ins, outs = a.op_io[k]
        add(f"op {k} {op} input {slot} = its own output (self-loop)", _put_i32(blob, pos,
                                                                                outs[0]))
    for k, pos in a.op_outputs:
        add(f"op {k} output = {a.tensor_count}", _put_i32(blob, pos, a.tensor_count))
        add(f"op {k} output = its input 0", _put_i32(blob, pos, a.op_io[k][0][0]))
    for k, op, slot, pos in a.op_inputs:
        if slot == 0 and op in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD"):
            ins = a.op_io[k][0]
            swapped = _put_i32(_put_i32(blob, pos, ins[1]), pos + 4, ins[0])
            add(f"op {k} {op} inputs 0 and 1 swapped", swapped)
    for tname, pos, count in a.int32_consts:
        for i in range(count):
            old = struct.unpack_from("<i", blob, pos + 4 * i)[0]
            for new in (old + 1, 7, -2, 0):
                if new != old:
                    add(f"{tname}[{i}]: {old}->{new}", _put_i32(blob, pos + 4 * i, new))
    for k, pos in a.opcode_index:
        add(f"op {k} opcode index 99", _put_u32(blob, pos, 99))
    return out


def audit_cases(data: dict, name: str, blob: bytes) -> list[Case]:
    """The audit's crashes: a DEQUANTIZE output's shape shrunk by one in its first dimension,
    for the classifier's weight (``fc/weight``) and for a convolution's weight."""
    a = anatomy(blob)
    shapes = {t: s for t, s, _ in a.tensors}
    deq_out = {}
    for k, op in enumerate(a.op_names):
        if op == "DEQUANTIZE":
            ins, outs = a.op_io[k]
            deq_out[a.tensors[outs[0]][0]] = a.tensors[ins[0]][0]
    out = []
    for want in ("fc", "conv"):
        # fc/weight by name (the audit's); a convolution's: the first rank-4 weight
        names = [t for t in deq_out if t == "fc/weight"] if want == "fc" else \
            [t for t in deq_out if len(shapes[t]) == 4]
        if not names:
            raise AssertionError(f"no DEQUANTIZE output of a {want} weight in {sorted(deq_out)}")
        t = names[0]
        pos = next(p for n, d, p in a.shape_dims if n == t and d == 0)
        out.append(_slice_case("audit", f"DEQUANTIZE output {t!r} shape[0] "
                                        f"{shapes[t][0]}->{shapes[t][0] - 1}", data, name,
                               _put_i32(blob, pos, shapes[t][0] - 1)))
    return out


def corpus(bundle: Path, byte_cases: int = 400, shape_limit: int | None = None,
           seed: int = 36) -> list[Case]:
    data, blob, name = base_bundle(bundle)
    return (byte_fuzz(data, name, blob, byte_cases, seed)
            + shape_patches(data, name, blob, shape_limit) + alloc_cases(data, name, blob)
            + audit_cases(data, name, blob) + manifest_cases(data, name, blob)
            + store_cases(data, name, blob) + api_cases(data, name, blob))
