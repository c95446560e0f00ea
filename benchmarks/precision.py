"""A bundle's precisions (float, dynamic range, int8: exporters.precision) measured where the
app is, and the user's alternative beside them.

Speed (1 thread, rounds alternated configuration by configuration so drift hits all alike):
per configuration the slice's own invoke, the whole pinned ``predict`` (every field on) and the
SDK's time between them; per width, what ``predict(x, width=w)`` answers with (the precision the
policy leaves to itself) and its ``predict``, against today's default (the float slice).

Quality (the test split, through the runtime): accuracy, NLL after the bundle's temperature,
OOD AUROC of the shipped score (``Prediction.ood_score``) per OOD group on the second half of
each group, conformal coverage and mean set size at alpha 0.1.

Baseline (``--baseline det.pt`` from ``benchmarks/baselines.py --save-det``): the same
architecture trained alone, its float slice quantized by ai-edge-quantizer's static int8
recipe (``static_wi8_ai8``, its own min-max calibration on ``--calib`` training images).

Boundary (a store bundle): what the integer slice's float interface costs. Per width, the
invoke of its float slice, of its integer slice (QUANTIZE in, DEQUANTIZE out) and of the same
network with int8 input and output (ai-edge-quantizer's static int8 recipe on the width's
float-weight slice, given the ranges the bundle records), 1 thread, alternated.

    python benchmarks/precision.py --bundle B --data ../shared/data/cifar10_dev.npz \
        --ood ../shared/data/ood32_dev.npz --ood-groups --baseline runs/ref/det_allconv.pt
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import edge_sdk
from edge_sdk.answers import metrics as M
from edge_sdk.bundle.records import width_key


def med_ms(ts: list[float]) -> float:
    return statistics.median(ts) * 1e3


def speed(model, x: np.ndarray, calls: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per configuration: median raw invoke of its slice and median pinned predict, ms."""
    configs = [c for c in model.manifest.configurations if c.scope == "point"]
    invoke: dict[str, list[float]] = {c.id: [] for c in configs}
    predict: dict[str, list[float]] = {c.id: [] for c in configs}
    slices = {}
    for c in configs:
        (it, inp, _, _), = model._build(c, plain=True)  # the exported slice's own graph
        xin = model._prepare(x)
        it.set_tensor(inp, xin)
        it.invoke()
        slices[c.id] = it
        for _ in range(20):
            model.predict(x, config_id=c.id)
    per = max(1, calls // rounds)
    for _ in range(rounds):
        for c in configs:
            it = slices[c.id]
            for _ in range(per):
                t0 = time.perf_counter()
                it.invoke()
                invoke[c.id].append(time.perf_counter() - t0)
            for _ in range(per):
                t0 = time.perf_counter()
                model.predict(x, config_id=c.id)
                predict[c.id].append(time.perf_counter() - t0)
    return {c.id: {"invoke": med_ms(invoke[c.id]), "predict": med_ms(predict[c.id])}
            for c in configs}


def width_choice(bundle: str, x: np.ndarray, calls: int) -> dict[str, dict]:
    """Per width: the configurations ``predict(x, width=w)`` answered with (share) and the
    median predict, in a fresh model (its own estimates), after a warm-up."""
    model = edge_sdk.load(bundle, threads=1)
    model.warm_up(config_ids=[c.id for c in model.manifest.configurations])
    out = {}
    for w in sorted({c.width for c in model.manifest.configurations}):
        ids, ts = [], []
        for _ in range(calls):
            t0 = time.perf_counter()
            p = model.predict(x, width=w)
            ts.append(time.perf_counter() - t0)
            ids.append(p.config_id)
        half = ids[len(ids) // 2:]  # after the policy has measured the variants
        share = {i: half.count(i) / len(half) for i in sorted(set(half))}
        out[width_key(w)] = {"share": share, "predict": med_ms(ts[len(ts) // 2:])}
    return out


def quality(model, xs, ys, ood: dict[str, np.ndarray]) -> dict[str, dict]:
    out = {}
    for c in model.manifest.configurations:
        if c.scope != "point":
            continue
        b = model.predict_batch(xs, config_id=c.id)
        probs = np.asarray(b.probs, np.float64)
        row = {"accuracy": float((probs.argmax(1) == ys).mean()),
               "nll": float(M.nll(probs, ys))}
        sets = np.asarray(b.prediction_sets)
        if sets.size:
            row["coverage"] = float(sets[np.arange(len(ys)), ys].mean())
            row["set_size"] = float(sets.sum(1).mean())
        s_in = np.asarray(b.ood_score, np.float64)
        for g, ox in ood.items():
            s_out = np.asarray(model.predict_batch(ox, config_id=c.id).ood_score, np.float64)
            row[f"auroc {g}"] = float(M.ood_auroc(s_in, s_out))
        out[c.id] = row
    return out


def plain_float_slice(path: str, shape: tuple[int, ...]) -> bytes:
    """The det network's float32 ``.tflite`` (nested with ``trainer.nest`` and cut at full
    width: the same function, BN folded)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import baseline_models as BM
    from exporters.tflite import lower_point_slice
    from edge_sdk.tflite.writer import write_tflite
    from trainer.config import config_from_dict
    from trainer.nesting import nest

    state = torch.load(path, weights_only=True)
    cfg = config_from_dict(state["config"])
    det = BM.plain_net(cfg, 1.0, **state["arch"])
    det.load_state_dict(state["state_dict"])
    nested = nest(det.eval()).truncate(1.0).eval()
    graph, weights, _ = lower_point_slice(nested, (1, *shape), "float")
    return write_tflite(graph, weights)


def aeq_static_int8(float_buf: bytes, samples: list[np.ndarray] | None = None,
                    ranges: dict | None = None) -> bytes:
    """ai-edge-quantizer's static int8 recipe (weights and activations int8) on ``float_buf``,
    its own min-max calibration on the input ``samples``, or the given tensor ->
    ``{min, max}`` ``ranges``; its progress lines kept out of the tables."""
    from ai_edge_quantizer import quantizer, recipe

    with contextlib.redirect_stdout(io.StringIO()):
        q = quantizer.Quantizer(float_buf, recipe.static_wi8_ai8())
        if ranges is None:
            ranges = q.calibrate({"serving_default": [{"input": x} for x in samples or []]})
        return bytes(q.quantize(ranges).quantized_model)


def invoke_ms(bufs: list[bytes], calls: int) -> list[float]:
    """Median invoke (ms, 1 thread) of each model on zeros, the models alternated call by call
    so drift hits all alike."""
    from ai_edge_litert.interpreter import Interpreter

    its = []
    for buf in bufs:
        it = Interpreter(model_content=buf, num_threads=1)
        it.allocate_tensors()
        d = it.get_input_details()[0]
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        it.invoke()
        its.append(it)
    ts: list[list[float]] = [[] for _ in its]
    for _ in range(calls):
        for k, it in enumerate(its):
            t0 = time.perf_counter()
            it.invoke()
            ts[k].append(time.perf_counter() - t0)
    return [med_ms(t) for t in ts]


def boundary(bundle: str, calls: int) -> dict[str, list[float]]:
    """Per width of a store bundle's integer slices: invoke ms of the float slice, the integer
    slice, and the same integer network with int8 input and output (module docstring)."""
    from edge_sdk.bundle import read_manifest
    from edge_sdk.store import materialize_graph
    from edge_sdk.store.sources import read_store
    from edge_sdk.tflite.integer import QMAX, QMIN, integer_graph
    from edge_sdk.tflite.writer import write_tflite

    m = read_manifest(bundle)
    store = read_store(bundle, m)
    out = {}
    for wk, quant in sorted(m.activation_quant.items()):
        g, arrays, _ = materialize_graph(store, m.graphs[wk], wk)
        gf, af, _ = materialize_graph(store, m.graphs[wk], wk, route="float")
        # each tensor's recorded grid as a range: ai-edge-quantizer derives the same grid
        ranges = {t: {"min": np.array(s * (QMIN - z), np.float32),
                      "max": np.array(s * (QMAX - z), np.float32)} for t, (s, z) in quant.items()}
        io8 = aeq_static_int8(write_tflite(gf, af), ranges=ranges)
        out[wk] = invoke_ms([write_tflite(g, arrays),
                             write_tflite(*integer_graph(g, arrays, quant)), io8], calls)
    return out


def baseline(path: str, model, data: Path, xs_raw, ys, calib: int, calls: int) -> dict:
    """The plain network trained alone + ai-edge-quantizer static int8: accuracy and invoke,
    on inputs normalised as the bundle normalises them (the same training split's)."""
    from ai_edge_litert.interpreter import Interpreter

    float_buf = plain_float_slice(path, tuple(model.manifest.input.shape[1:]))
    rng = np.random.default_rng(0)
    train = np.load(data)["x_train"]
    pick = train[rng.choice(len(train), calib, replace=False)]
    int8_buf = aeq_static_int8(float_buf, samples=[model._prepare(x) for x in pick])
    out = {}
    for name, buf in (("float", float_buf), ("int8", int8_buf)):
        it = Interpreter(model_content=buf, num_threads=1)
        it.allocate_tensors()
        inp, o = it.get_input_details()[0], it.get_output_details()[0]
        si, zi = inp["quantization"]
        so, zo = o["quantization"]
        logits = []
        for x in xs_raw:
            xin = model._prepare(x)
            if inp["dtype"] == np.int8:
                xin = np.clip(np.round(xin / si) + zi, -128, 127).astype(np.int8)
            it.set_tensor(inp["index"], xin)
            it.invoke()
            y = it.get_tensor(o["index"]).astype(np.float32)
            logits.append((y - zo) * so if o["dtype"] == np.int8 else y)
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            it.invoke()
            ts.append(time.perf_counter() - t0)
        out[name] = {"accuracy": float((np.concatenate(logits).argmax(1) == ys).mean()),
                     "invoke": med_ms(ts), "bytes": len(buf)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--data", required=True, help="the npz the bundle was trained on")
    p.add_argument("--ood", default=None, help="an npz of OOD images")
    p.add_argument("--ood-groups", action="store_true",
                   help="the OOD npz's y_test are groups (ood32_dev: 0 far, 1 near)")
    p.add_argument("--calls", type=int, default=2000, help="timed calls per configuration")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--max-eval", type=int, default=None)
    p.add_argument("--baseline", default=None, help="det .pt from baselines.py --save-det")
    p.add_argument("--calib", type=int, default=256)
    p.add_argument("--parts", default="speed,choice,quality,baseline,boundary",
                   help="which tables: speed, choice (predict with a width pinned), quality, "
                        "baseline, boundary (the integer slices' float interface)")
    args = p.parse_args()
    parts = set(args.parts.split(","))

    d = np.load(args.data)
    xs, ys = d["x_test"][:args.max_eval], d["y_test"][:args.max_eval].astype(np.int64)
    model = edge_sdk.load(args.bundle, threads=1)
    x = xs[0]
    t = speed(model, x, args.calls, args.rounds) if parts & {"speed", "choice"} else {}
    if "speed" in parts:
        print(f"\n1 thread, medians of {args.calls} calls per configuration in {args.rounds} "
              "alternated rounds\n")
        print("| configuration | precision | invoke ms | predict ms | SDK us | invoke / float "
              "| predict / float |\n|---|---|---|---|---|---|---|")
        for c in model.manifest.configurations:
            if c.id not in t:
                continue
            ref = next(f for f in model.manifest.configurations
                       if f.variant_of == c.variant_of and f.precision == "float")
            r, f = t[c.id], t[ref.id]
            print(f"| {c.id} | {c.precision} | {r['invoke']:.4f} | {r['predict']:.4f} | "
                  f"{(r['predict'] - r['invoke']) * 1e3:.1f} | "
                  f"{r['invoke'] / f['invoke']:.2f} | {r['predict'] / f['predict']:.2f} |")
    if "choice" in parts:
        ch = width_choice(args.bundle, x, max(200, args.calls // 2))
        print("\n| width | predict(x, width=w) answered by (second half) | its predict ms | "
              "fastest pinned | float predict ms | ratio |\n|---|---|---|---|---|---|")
        for wk, row in ch.items():
            fid = f"w{wk}-point"
            mine = [c for c in model.manifest.configurations if c.id.startswith(fid)]
            fastest = min(mine, key=lambda c: t[c.id]["predict"]).id
            share = ", ".join(f"{i} {s:.0%}" for i, s in row["share"].items())
            print(f"| {wk} | {share} | {row['predict']:.4f} | {fastest} | "
                  f"{t[fid]['predict']:.4f} | {row['predict'] / t[fid]['predict']:.2f} |")

    ood = {}
    if args.ood and "quality" in parts:
        o = np.load(args.ood)
        ox = o["x_test"]
        # ood32_dev's y_test are its groups (0 far, 1 near); any other set is one group
        oy = o["y_test"] if args.ood_groups else np.zeros(len(ox), np.int64)
        names = {0: "far", 1: "near"} if args.ood_groups else {0: Path(args.ood).stem}
        for g in np.unique(oy):
            sel = ox[oy == g]
            ood[names.get(int(g), str(g))] = sel[len(sel) // 2:][:args.max_eval]  # 2nd half
    qual = quality(model, xs, ys, ood) if "quality" in parts else {}
    cols = ["accuracy", "nll", *[f"auroc {g}" for g in ood], "coverage", "set_size"]
    if qual:
        print(f"\ntest split ({len(ys)} images), through the runtime; OOD: second halves\n")
        print("| configuration | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1))
    for cid, row in qual.items():
        print(f"| {cid} | " + " | ".join(f"{row[k]:.4f}" if k in row else "-" for k in cols)
              + " |")
    if args.baseline and "baseline" in parts:
        b = baseline(args.baseline, model, Path(args.data), xs, ys, args.calib, args.calls)
        print(f"\nthe plain network trained alone (float32 slice) and through ai-edge-quantizer's "
              f"static int8 recipe ({args.calib} calibration images, its min-max):\n")
        print("| network | accuracy | invoke ms | bytes |\n|---|---|---|---|")
        for name, r in b.items():
            print(f"| plain {name} | {r['accuracy']:.4f} | {r['invoke']:.4f} | {r['bytes']:,} |")

    if "boundary" in parts and model.manifest.activation_quant:
        print(f"\nthe integer slices' float interface (QUANTIZE in, DEQUANTIZE out) against the "
              f"same network with int8 input and output, medians of {args.calls} alternated "
              "invokes:\n")
        print("| width | float ms | int8 ms | int8 I/O ms | interface us | int8 / float |\n"
              "|---|---|---|---|---|---|")
        for wk, (fl, ours, io8) in boundary(args.bundle, args.calls).items():
            print(f"| {wk} | {fl:.4f} | {ours:.4f} | {io8:.4f} | {(ours - io8) * 1e3:.1f} | "
                  f"{ours / fl:.2f} |")


if __name__ == "__main__":
    main()
