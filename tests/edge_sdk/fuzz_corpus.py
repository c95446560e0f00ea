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

A child process runs each case (``os.fork`` of a server that imported everything once) and
reports one outcome: ``refused`` (an EdgeSdkError subclass), ``answered`` (finite
probabilities summing to 1, the label their argmax), ``nan`` (an answer with NaN or inf),
``raw`` (any other exception) or ``crash`` (killed by a signal, or no answer within the
time limit). The promise: 0 crash, 0 raw, 0 nan.
"""
from __future__ import annotations

import functools
import hashlib
import io
import math
import os
import pickle
import random
import select
import shutil
import signal
import struct
import time
import traceback
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from edge_sdk.bundle import MANIFEST_NAME, read_manifest
from edge_sdk.tflite_reader import _Flat

OUTCOMES = ("refused", "answered", "crash", "raw", "nan")
MINIMUMS = {"byte-fuzz": 400, "shape-patch": 150, "alloc": 33, "audit": 2, "manifest": 12,
            "store": 6, "api": 12}
TIME_LIMIT_S = 30.0  # a hang guard per case, not a timing assertion


@dataclass
class Case:
    cls: str
    name: str
    # (work directory) -> what the child runs: a callable returning the outcome details
    run: Callable[[Path], object]
    files: dict[str, bytes] = field(default_factory=dict)


# ------------------------------------------------------------------------- the base bundle
def base_bundle(bundle: Path) -> tuple[dict, bytes, str]:
    """(manifest dict, slice bytes, slice name) of a one-configuration bundle: the session
    bundle's narrowest point configuration."""
    m = read_manifest(bundle)
    point = min((c for c in m.configurations if c.scope == "point"), key=lambda c: c.width)
    data = m.to_dict()
    keep = [c for c in data["configurations"] if c["id"] == point.id][0]
    keep["cascade"] = {}
    data["configurations"] = [keep]
    name = point.files[0].name
    return data, (bundle / name).read_bytes(), name


def _manifest_text(data: dict) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


def _with_slice(data: dict, name: str, blob: bytes) -> dict[str, bytes]:
    """The bundle's files with ``blob`` as the slice, its sha256 and size in the manifest."""
    d = pickle.loads(pickle.dumps(data))
    f = d["configurations"][0]["files"][0]
    f["sha256"], f["bytes"] = hashlib.sha256(blob).hexdigest(), len(blob)
    return {MANIFEST_NAME: _manifest_text(d), name: blob}


def write_case(files: dict[str, bytes], directory: Path) -> Path:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for n, b in files.items():
        (directory / n).write_bytes(b)
    return directory


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
    from edge_sdk.tflite_writer import BUILTIN_CODES, TENSOR_TYPES

    code_name = {v: k for k, v in BUILTIN_CODES.items()}
    type_name = {v: k for k, v in TENSOR_TYPES.items()}
    f = _Flat(blob, "anatomy")
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


# ----------------------------------------------------------------------- what a child runs
def _x(manifest: dict, seed: int = 0) -> np.ndarray:
    spec = manifest["input"]
    lo, hi = spec["value_range"]
    shape = spec["shape"][1:]
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def load_and_predict(directory: Path, x: np.ndarray, **load_kwargs) -> list:
    """What an app does: load, then one predict and one batch of two."""
    import edge_sdk

    model = edge_sdk.load(directory, profile=None, **load_kwargs)
    answers = [model.predict(x)]
    answers += model.predict_batch(np.stack([x, x[::-1].copy()]))
    return answers


def classify(answers: list, classes: int) -> str:
    for p in answers:
        probs = np.asarray(p.probs, np.float64)
        if not (np.isfinite(probs).all() and math.isfinite(p.confidence)
                and math.isfinite(p.entropy) and math.isfinite(p.mutual_info)):
            return "nan"
        if (len(probs) != classes or abs(probs.sum() - 1) > 1e-4 or (probs < 0).any()
                or p.label != int(probs.argmax()) or p.confidence != probs[p.label]):
            return "nan"  # a malformed answer counts with the NaN ones: never silent
    return "answered"


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


def manifest_cases(data: dict, name: str, blob: bytes) -> list[Case]:
    x = _x(data)
    classes = len(data["labels"])
    base = _manifest_text(data).decode()
    cfg = data["configurations"][0]
    out = []

    def add(label: str, text: str | bytes) -> None:
        files = {MANIFEST_NAME: text.encode() if isinstance(text, str) else text, name: blob}
        out.append(Case("manifest", label, lambda d: classify(load_and_predict(d, x), classes),
                        files))

    def with_value(path: tuple, value: object) -> str:
        d = pickle.loads(pickle.dumps(data))
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return _manifest_text(d).decode()

    add("flow nesting 100,000 deep", "a: " + "[" * 100_000 + "]" * 100_000 + "\n" + base)
    add("block nesting 300 deep", "".join(" " * i + "k:\n" for i in range(300)) + base)
    bomb = "\n".join([f"_a0: &a0 [{', '.join(['lol'] * 9)}]"] +
                     [f"_a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)])
    add("alias bomb", bomb + "\n" + base.replace("labels:", "labels: *a8\nx_labels:", 1))
    for path, value in ((("input", "std"), [1e-45]), (("input", "std"), [1e39]),
                        (("input", "mean"), [1e39]), (("input", "value_range"), [0.0, 1e300]),
                        (("configurations", 0, "temperature"), 5e-324),
                        (("configurations", 0, "temperature"), 1e39),
                        (("configurations", 0, "macs"), 10 ** 400),
                        (("configurations", 0, "width"), float("nan"))):
        add(f"{'.'.join(map(str, path))} = {value!r:.40}", with_value(path, value))
    add("duplicate key temperature", base.replace(
        "  temperature: ", f"  temperature: 1.0\n  temperature: ", 1))
    add("duplicate top-level key", base + f"labels: {list(reversed(data['labels']))}\n")
    add("a python tag", base.replace("labels:", "labels: !!python/object/apply:os.system "
                                                "['true']\nx:", 1))
    add("not UTF-8", base.encode() + b"\xff\xfe")
    add("int of 5,000 digits", base.replace("  macs: ", "  macs: " + "9" * 5000 + " #", 1))
    del cfg
    return out


@functools.lru_cache(maxsize=1)
def _gib_of_zeros() -> bytes:
    """One zlib stream of 1 GiB of zeros: ~1 MB (made once per process)."""
    z = zlib.compressobj(9)
    return b"".join(z.compress(bytes(1 << 20)) for _ in range(1024)) + z.flush()


def store_cases(data: dict, name: str, blob: bytes) -> list[Case]:
    from edge_sdk.bundle import Manifest, manifest_to_yaml
    from edge_sdk.store.container import _PREFIX, FORMAT_VERSION, MAGIC

    x = _x(data)
    classes = len(data["labels"])

    def store_bundle(store: bytes) -> dict[str, bytes]:
        d = pickle.loads(pickle.dumps(data))
        c = d["configurations"][0]
        c["materialize"] = [{"width": f"{c['width']:.2f}", "sample": None, "heads": 0}]
        d.update(schema_version=3, layout="store",
                 store={"name": "store.bin", "sha256": hashlib.sha256(store).hexdigest(),
                        "bytes": len(store)},
                 graphs={f"{c['width']:.2f}": {"tensors": [], "ops": [], "inputs": [],
                                               "outputs": []}})
        text = manifest_to_yaml(Manifest.from_dict(d))
        return {MANIFEST_NAME: text.encode(), "store.bin": store}

    v2 = lambda inner, stream: _PREFIX.pack(MAGIC, 2, inner) + stream  # noqa: E731
    noise = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    header = b"[" * 200_000 + b"]" * 200_000
    gib = 1 << 30
    stream = _gib_of_zeros()
    cases = {
        "header nested 200,000 deep": _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header,
        "1 MB stream declaring 1 GiB (zlib bomb)": v2(gib, stream),
        "stream declaring 2 GiB": v2(2 * gib, stream),
        "plausible ratio, garbage inside": v2(8 << 20, zlib.compress(
            np.random.default_rng(0).integers(0, 4, 8 << 20, dtype=np.uint8).tobytes(), 1)),
        "truncated stream": v2(len(noise), zlib.compress(noise)[:-10]),
        "trailing bytes": v2(16, zlib.compress(b"x" * 16) + b"tail"),
        "wrong magic": b"NOTSTORE" + b"\0" * 64,
    }
    return [Case("store", label, lambda d: classify(load_and_predict(d, x), classes),
                 store_bundle(s)) for label, s in cases.items()]


def api_cases(data: dict, name: str, blob: bytes) -> list[Case]:
    files = _with_slice(data, name, blob)
    x = _x(data)
    classes = len(data["labels"])
    shape = tuple(data["input"]["shape"][1:])

    def load_kw(**kw):
        return lambda d: classify(load_and_predict(d, x, **kw), classes)

    def predict(value):
        return lambda d: classify(load_and_predict(d, value), classes)

    def budget(**kw):
        def run(d):
            import edge_sdk

            edge_sdk.Budget(**kw)
            return "answered"
        return run

    def npy(raw: bytes):
        def run(d):
            from edge_sdk.bundle import read_manifest as rm
            from edge_sdk.input_files import read_input

            (d / "x.npy").write_bytes(raw)
            return classify(load_and_predict(d, read_input(str(d / "x.npy"),
                                                           rm(d).input)), classes)
        return run

    hdr = io.BytesIO()
    np.lib.format.write_array_header_1_0(hdr, {"descr": "<f8", "fortran_order": False,
                                                "shape": (10 ** 12,)})
    good = io.BytesIO()
    np.save(good, x)
    cases = {
        "load(memory_cap_mb=10**400)": load_kw(memory_cap_mb=10 ** 400),
        "load(memory_cap_mb=nan)": load_kw(memory_cap_mb=math.nan),
        "load(threads=10**400)": load_kw(threads=10 ** 400),
        "load(hysteresis=10**400)": load_kw(hysteresis=10 ** 400),
        "load(half_life_s=inf)": load_kw(half_life_s=float("inf")),
        "load(target_accuracy=0.123)": load_kw(target_accuracy=0.123),
        "Budget(latency_ms=10**400)": budget(latency_ms=10 ** 400),
        "Budget(memory_mb=-1)": budget(memory_mb=-1),
        "predict(NaN input)": predict(np.full(shape, np.nan, np.float32)),
        "predict(inf input)": predict(np.full(shape, np.inf, np.float32)),
        "predict(1e30 input)": predict(np.full(shape, 1e30, np.float32)),
        "predict(wrong shape)": predict(np.zeros((3, 3), np.float32)),
        "predict(object array)": predict(np.array([object()] * 4, dtype=object)),
        "predict(string)": predict("not an array"),
        ".npy declaring 10**12 elements": npy(hdr.getvalue() + b"\0" * 8),
        ".npy of garbage": npy(b"\x93NUMPY\x01\x00" + b"\xff" * 40),
        ".npy truncated": npy(good.getvalue()[:-7]),
        ".npy valid (control)": npy(good.getvalue()),
    }
    return [Case("api", label, run, files) for label, run in cases.items()]


def corpus(bundle: Path, byte_cases: int = 400, shape_limit: int | None = None,
           seed: int = 36) -> list[Case]:
    data, blob, name = base_bundle(bundle)
    return (byte_fuzz(data, name, blob, byte_cases, seed)
            + shape_patches(data, name, blob, shape_limit) + alloc_cases(data, name, blob)
            + audit_cases(data, name, blob) + manifest_cases(data, name, blob)
            + store_cases(data, name, blob) + api_cases(data, name, blob))


# ----------------------------------------------------------------------------- the server
@dataclass
class Result:
    case: Case
    outcome: str
    detail: str


def _child(case: Case, directory: Path, w: int) -> None:
    """In the forked child: run the case, write one pickled (outcome, detail), exit."""
    from edge_sdk.errors import EdgeSdkError

    try:
        outcome = case.run(directory)
        detail = ""
    except EdgeSdkError as exc:
        outcome, detail = "refused", f"{type(exc).__name__}: {str(exc)[:300]}"
    except BaseException as exc:  # noqa: BLE001 - what the corpus exists to find
        outcome = "raw"
        detail = f"{type(exc).__name__}: {str(exc)[:200]} | " + \
            " ".join(traceback.format_exc().splitlines()[-4:])[:400]
    os.write(w, pickle.dumps((outcome, detail)))
    os._exit(0)


def run_case(case: Case, work: Path, limit_s: float = TIME_LIMIT_S) -> Result:
    directory = write_case(case.files, work / "case") if case.files else work
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        import faulthandler

        faulthandler.disable()  # pytest's would print a traceback for every expected crash
        try:
            _child(case, directory, w)
        finally:
            os._exit(70)
    os.close(w)
    chunks, deadline = [], time.monotonic() + limit_s
    while True:
        ready, _, _ = select.select([r], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return Result(case, "crash", f"no answer within {limit_s:g} s (killed)")
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return Result(case, "crash", f"killed by signal {signal.Signals(sig).name}")
    try:
        outcome, detail = pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 - no report: the child died without one
        return Result(case, "crash", f"exit status {os.WEXITSTATUS(status)}, no report")
    return Result(case, outcome, detail)


def run_corpus(cases: list[Case], work: Path, progress: Callable[[int], None] | None = None
               ) -> list[Result]:
    """Every case in its own forked child, one after another (this process imports the
    runtime and the interpreter once, so a child costs a fork, not an interpreter start)."""
    import edge_sdk.backends as backends
    import edge_sdk.runtime  # noqa: F401 - imported once, before the forks

    backends.interpreter_class()  # the backend module imported, its banner spent once
    work.mkdir(parents=True, exist_ok=True)
    out = []
    for i, c in enumerate(cases):
        out.append(run_case(c, work))
        if progress is not None:
            progress(i)
    return out


def table(results: list[Result]) -> dict[str, Counter]:
    """class -> Counter of outcomes (plus "cases")."""
    t: dict[str, Counter] = {}
    for r in results:
        c = t.setdefault(r.case.cls, Counter())
        c["cases"] += 1
        c[r.outcome] += 1
    return t


def format_table(t: dict[str, Counter]) -> str:
    rows = [f"{'class':<12} {'cases':>6} " + " ".join(f"{o:>8}" for o in OUTCOMES)]
    total = Counter()
    for cls, c in t.items():
        total.update(c)
        rows.append(f"{cls:<12} {c['cases']:>6} " + " ".join(f"{c[o]:>8}" for o in OUTCOMES))
    rows.append(f"{'total':<12} {total['cases']:>6} "
                + " ".join(f"{total[o]:>8}" for o in OUTCOMES))
    return "\n".join(rows)
