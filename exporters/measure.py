"""Running and measuring written ``.tflite`` files with the real LiteRT interpreter."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter


def run_tflite(model: bytes, xs: np.ndarray, threads: int = 1) -> np.ndarray:
    """Logits for every NHWC sample in ``xs`` (one invoke per sample, as a device runs it)."""
    it = Interpreter(model_content=model, num_threads=threads)
    it.allocate_tensors()
    inp, out = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    rows = []
    for x in np.asarray(xs, dtype=np.float32):
        it.set_tensor(inp, x[None])
        it.invoke()
        rows.append(it.get_tensor(out).copy())
    return np.stack(rows)


def latency_ms(model: bytes, x: np.ndarray, repeats: int = 100, threads: int = 1) -> float:
    """Median wall time of ``invoke()`` over ``repeats`` runs after a warm-up (1 thread)."""
    it = Interpreter(model_content=model, num_threads=threads)
    it.allocate_tensors()
    inp = it.get_input_details()[0]["index"]
    it.set_tensor(inp, np.asarray(x, dtype=np.float32)[None])
    for _ in range(5):
        it.invoke()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        it.invoke()
        times.append((time.perf_counter() - t0) * 1000)
    return float(statistics.median(times))


_PROBE = r"""
import json, sys, numpy as np, psutil
from ai_edge_litert.interpreter import Interpreter
data = open(sys.argv[1], "rb").read()
proc = psutil.Process()
before = proc.memory_info().rss
it = Interpreter(model_content=data, num_threads=1)
it.allocate_tensors()
d = it.get_input_details()[0]
it.set_tensor(d["index"], np.zeros(d["shape"], dtype=np.float32))
it.invoke()
print(json.dumps({"rss_increase": proc.memory_info().rss - before}))
"""


def memory_mb(model: bytes, weight_bytes: int) -> float:
    """RSS increase after creating the interpreter, ``allocate_tensors()`` and a first invoke,
    measured in a fresh process (in-process RSS is blurred by earlier allocations), floored at
    the weight bytes: LiteRT exposes no arena size, and DEQUANTIZE keeps an fp32 copy."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.tflite"
        path.write_bytes(model)
        out = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True,
                             text=True, check=True, timeout=120)
    rss = json.loads(out.stdout.strip().splitlines()[-1])["rss_increase"]
    return max(rss, weight_bytes) / 2 ** 20
