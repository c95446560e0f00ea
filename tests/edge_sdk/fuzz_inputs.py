"""Issue 36's corpus, the cases that are not slice edits (tests/edge_sdk/fuzz_corpus.py builds
them with the same one-configuration bundle): hostile manifests, hostile stores and bad API
arguments and inputs. numpy + pyyaml; no torch."""
from __future__ import annotations

import functools
import hashlib
import io
import math
import pickle
import zlib

import numpy as np

from edge_sdk.bundle import MANIFEST_NAME
from fuzz_server import Case, _manifest_text, _with_slice, _x, classify, load_and_predict


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
        d.pop("uncertainty", None)
        d.pop("input_stats", None)
        for cfg in d["configurations"]:  # schema version 8's per-target cascade plans
            for e in cfg.get("cascade", {}).values():
                e.pop("targets", None)
            cfg.pop("val_accuracy", None)  # schema version 10's
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
            from edge_sdk.inputs.files import read_input

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
