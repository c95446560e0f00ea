"""A tiny ``layout: store`` bundle built by hand with numpy: no torch, no exporter (issue 21).

Why by hand: the torch-blocked CI steps (.ci/run ``device`` and ``tflite-runtime``, numpy < 2)
must cover materialisation, and a store made here from fixed integers is the same store on
every numpy version, so the sha256 of what :func:`edge_sdk.store.materialize` makes from it is
a cross-version check (tests/edge_sdk/test_store_materialize.py pins it).

The network: input ``[1, 6, 6, 1]`` -> CONV_2D 3x3 SAME (8 channels at full width, ReLU) ->
MEAN over H, W -> FULLY_CONNECTED to 3 classes (the classifier, ``fc``); widths 0.5 (4
channels) and 1.0. Both layers Gaussian (mu + sigma * eps): ``conv1`` stored as int8 codes,
``fc`` as a 3-bit codebook exact on a power-of-two step (PWFN-like); per width the point
network's fold (a, t) and, for ``conv1`` only, one (float16) per sample (``fc`` folds the same
for every sample), one negative ``a`` (the sign flip of docs/store.md §3.2). Configurations per width: point, head 1 .. S_MAX, all 1 .. S_MAX (the
exporter's S = 1 .. S_max candidates; all S lists sample files s0 .. s(S-1)).

    python tests/store_support.py OUT_DIR     # write the bundle (and print its file hashes)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from edge_sdk.bundle import Manifest, StoreEntry, file_entry, write_bundle
from edge_sdk.tflite.graph import Graph
from edge_sdk.tflite.tensors import Op, Tensor
from edge_sdk.store import encode_store, pack_bits
from edge_sdk.store.materialize import materialize
from edge_sdk.store.sampler import SAMPLER

S_MAX = 3
HW, CLASSES, FULL = 6, 3, 8
WIDTHS = {"0.50": 4, "1.00": FULL}
LABELS = ["ant", "bee", "cat"]
SEED = 20240521


def _ints(n: int, lo: int, hi: int, k: int) -> np.ndarray:
    """Deterministic integers in [lo, hi] from a fixed recurrence (no numpy RNG: its streams
    are not promised across versions), ``k`` a per-array offset."""
    i = np.arange(n, dtype=np.int64)
    return lo + (i * 7919 + k * 104729 + (i * i) % 97) % (hi - lo + 1)


def store_arrays() -> tuple[dict, dict[str, np.ndarray]]:
    """(index, arrays) of the tiny store (docs/store.md §2, edge_sdk.store.materialize)."""
    conv_shape, fc_shape = [FULL, 1, 3, 3], [CLASSES, FULL]
    conv_codes = _ints(72, -127, 127, 1).astype(np.int8).reshape(conv_shape)
    conv_step = (np.arange(1, FULL + 1, dtype=np.float32) / np.float32(512)).astype(np.float32)
    # fc: a 5-value codebook on the power-of-two step 2^-5 (values exact on it: route int8)
    book = (np.array([-6, -2, 0, 3, 8], np.float32) / np.float32(32)).astype(np.float32)
    fc_idx = _ints(CLASSES * FULL, 0, 4, 2).astype(np.uint8)
    fc_step = np.full(CLASSES, 1 / 32, np.float32)
    sig_book = np.array([0.0, 0.002, 0.005, 0.01], np.float32)
    arrays = {
        "conv1/codes": conv_codes, "conv1/step": conv_step,
        "conv1/sigma_codebook": sig_book,
        "conv1/sigma_index": np.frombuffer(pack_bits(_ints(72, 0, 3, 3), 2), np.uint8),
        "fc/codebook": book, "fc/step": fc_step,
        "fc/index": np.frombuffer(pack_bits(fc_idx, 3), np.uint8),
        "fc/sigma_codebook": sig_book,
        "fc/sigma_index": np.frombuffer(pack_bits(_ints(CLASSES * FULL, 0, 3, 4), 2),
                                        np.uint8),
    }
    layers = {
        "conv1": {"kind": "conv", "shape": conv_shape, "flat_hw": [1, 1], "encoding": "int8",
                  "bits": 8, "route": "int8", "sampler": "normal", "sigma_bits": 2},
        "fc": {"kind": "linear", "shape": fc_shape, "flat_hw": [1, 1],
               "encoding": "codebook", "bits": 3, "route": "int8", "sampler": "normal",
               "sigma_bits": 2},
    }
    widths = {}
    for wk, ch in WIDTHS.items():
        channels = ch + CLASSES

        def fold(n: int, row: int) -> np.ndarray:  # (a, t) of n channels
            a = (1 + _ints(n, 0, 40, 10 + row).astype(np.float32) / 40)
            a[1] = -a[1]  # a negative BN scale: the int8 codes' sign flips
            return np.stack([a, _ints(n, -20, 20, 20 + row).astype(np.float32) / 64])

        arrays[f"{wk}/fold"] = fold(channels, 0)  # the point network's, every layer
        # conv1's batch norm re-collected per sample (its own fold, float16); fc folds the
        # same for every sample (sfold null: the point fold)
        arrays[f"{wk}/sfold"] = np.stack([fold(ch, 1 + s) for s in range(S_MAX)]) \
            .astype(np.float16)
        widths[wk] = {"width": float(wk), "channels": channels, "layers": {
            "conv1": {"out": ch, "in": None, "fold": 0, "sfold": 0, "in_scale": None},
            "fc": {"out": CLASSES, "in": [[0, ch]], "fold": ch, "sfold": None,
                   "in_scale": None}}}
    index = {"version": 2, "sampler": SAMPLER, "posterior": "gaussian",
             "seed": SEED, "weights": "dequantize", "classifier": "fc", "samples": S_MAX,
             "layers": layers, "widths": widths}
    return index, arrays


def graph(channels: int) -> Graph:
    """One width's point graph description, weights by reference (the template)."""
    return Graph(
        tensors=[Tensor("input", (1, HW, HW, 1)),
                 Tensor("conv1/weight", (channels, 3, 3, 1), weight="conv1/weight"),
                 Tensor("conv1/bias", (channels,), weight="conv1/bias"),
                 Tensor("conv1", (1, HW, HW, channels)),
                 Tensor("pool", (1, channels)),
                 Tensor("fc/weight", (CLASSES, channels), weight="fc/weight"),
                 Tensor("fc/bias", (CLASSES,), weight="fc/bias"),
                 Tensor("logits", (1, CLASSES))],
        ops=[Op("CONV_2D", ["input", "conv1/weight", "conv1/bias"], ["conv1"],
                {"stride": 1, "padding": "SAME", "activation": "relu"}),
             Op("MEAN", ["conv1"], ["pool"], {"axes": [1, 2], "keep_dims": False}),
             Op("FULLY_CONNECTED", ["pool", "fc/weight", "fc/bias"], ["logits"], {})],
        inputs=["input"], outputs=["logits"], batch_dim=0)


def _config(cid: str, wk: str, scope: str, samples: int, files: list, recipes: list) -> dict:
    w = float(wk)
    return {"id": cid, "width": w, "scope": scope, "samples": samples, "files": files,
            "invokes": len(files),
            "output": {"kind": "logits", "shape": [samples if scope == "head" else 1, CLASSES]},
            "temperature": 1.0, "temperature_folded": False, "weights": "dequantize",
            "macs": int(HW * HW * 9 * WIDTHS[wk] + WIDTHS[wk] * CLASSES), "params": 100,
            "unique_values": None, "weight_entropy_bits": None, "thresholds": {"0.95": 0.5},
            "val_nll": round(1.2 - 0.2 * w - 0.01 * samples - 0.005 * (scope == "all"), 6),
            "test": {}, "latency_ms": None, "memory_mb": None, "materialize": recipes}


def build(out_dir: str | Path, force: bool = False, compress: bool = False) -> Path:
    """Write the tiny store bundle at ``out_dir``; every listed sha256 is that of the bytes
    :func:`materialize` makes (as the exporter lists them). ``compress``: store.bin as the
    container's version 2 (deflated; the pinned sha256 is version 1's)."""
    from edge_sdk.store import Store

    index, arrays = store_arrays()
    store = Store(index=index, arrays=arrays)
    blob = encode_store(store, compress=compress)
    graphs = {wk: graph(ch).to_dict() for wk, ch in WIDTHS.items()}
    configs = []
    for wk in WIDTHS:
        def entry(name: str, recipe: dict) -> dict:
            data = materialize(store, graphs[wk], wk, sample=recipe["sample"],
                               heads=recipe["heads"])
            return file_entry(name, data).to_dict()

        point = {"width": wk, "sample": None, "heads": 0}
        configs.append(_config(f"w{wk}-point", wk, "point", 1,
                               [entry(f"w{wk}-point.tflite", point)], [point]))
        for s in range(1, S_MAX + 1):
            head = {"width": wk, "sample": None, "heads": s}
            configs.append(_config(f"w{wk}-head{s}", wk, "head", s,
                                   [entry(f"w{wk}-head{s}.tflite", head)], [head]))
        samples = [{"width": wk, "sample": i, "heads": 0} for i in range(S_MAX)]
        files = [entry(f"w{wk}-s{i}.tflite", r) for i, r in enumerate(samples)]
        for s in range(1, S_MAX + 1):
            configs.append(_config(f"w{wk}-all{s}", wk, "all", s, files[:s], samples[:s]))
    manifest = Manifest.from_dict({
        "schema_version": 3, "layout": "store", "batch_dim": 0,
        "input": {"shape": [1, HW, HW, 1], "layout": "NHWC", "dtype": "float32",
                  "value_range": [0.0, 1.0], "mean": [0.5], "std": [0.25]},
        "labels": LABELS, "source": {"made_by": "tests/store_support.py"},
        "store": file_entry("store.bin", blob, StoreEntry).to_dict(),
        "graphs": graphs, "configurations": configs})
    return write_bundle(out_dir, manifest, {"store.bin": blob}, force=force)


if __name__ == "__main__":
    from edge_sdk.bundle import read_manifest

    path = build(sys.argv[1], force=True)
    m = read_manifest(path, verify=False)
    print(f"{m.store.name} {m.store.sha256} {m.store.bytes}")
    for e in m.file_entries():
        print(f"{e.name} {e.sha256} {e.bytes}")
