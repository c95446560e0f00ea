"""Issue 35's coverage table: torchvision's own CNNs through nest -> train -> slice -> TFLite ->
interpreter, one row per model (not in CI; the CI test of each layer kind is
tests/exporters/test_any_cnn.py).

Per model: built with ``weights=None`` (no network) and 10 classes, nested with trainer.nest's
default arguments (``--residual stage --nest-stem`` for goal 3's second figure), trained
``--steps`` steps of batch 32 on the first ``--images`` cifar10_dev training images (32x32;
inception_v3 upsampled to 75x75), sliced at 0.25 / 0.5 / 1 (batch norms re-collected on 256
training images), each slice exported on the float route and run by the interpreter
(LiteRT here; ``--tflite-runtime VENV/bin/python`` re-runs every file on tflite-runtime 2.14).

Columns: nested (or the refusal, first line), fidelity = the largest over widths of
max |TFLite - torch truncation| / max |torch truncation| on 32 test inputs (float route; the
reference is the slice in float64), torch f32 = the same for torch's own float32 run (the
slice's conditioning: TFLite cannot be expected below it),
width1 = the same for the freshly nested network at width 1.0 against the source network
(before training, default arguments), MACs counted from each slice's graph (and the ratio to
width 1), "0.25 exported as" = the width `edge-sdk export` records for a requested 0.25 (every
unit cut at its own group boundary, the smallest share any unit keeps; the slices measured here
are the exported ones), bytes = each width's float TFLite file (KB), mono = MACs and bytes strictly
increase with width, seconds for the whole row.

    .venv/bin/python benchmarks/any_cnn.py resnet18 mobilenet_v3_small --steps 200
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_sdk.errors import EdgeSdkError  # noqa: E402
from edge_sdk.tflite.graph import graph_stats  # noqa: E402
from exporters.export import snapped_widths  # noqa: E402
from exporters.slice import make_slice  # noqa: E402
from exporters.tflite import export_point_slice, lower_point_slice  # noqa: E402
from trainer.nesting import nest  # noqa: E402

MODELS = ["resnet18", "resnet50", "resnext50_32x4d", "mobilenet_v2", "mobilenet_v3_small",
          "mobilenet_v3_large", "efficientnet_b0", "mnasnet0_5", "shufflenet_v2_x0_5",
          "squeezenet1_0", "squeezenet1_1", "googlenet", "inception_v3", "densenet121",
          "regnet_x_400mf", "regnet_y_400mf", "convnext_tiny", "vit_b_16"]
WIDTHS = (0.25, 0.5, 1.0)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10_dev.npz"
_RUN = """import sys, numpy as np
from tflite_runtime.interpreter import Interpreter
x = np.load(sys.argv[2])
it = Interpreter(model_path=sys.argv[1], num_threads=1)
i = it.get_input_details()[0]["index"]
it.resize_tensor_input(i, list(x.shape)); it.allocate_tensors(); it.set_tensor(i, x); it.invoke()
np.save(sys.argv[3], it.get_tensor(it.get_output_details()[0]["index"]))
"""


def plain(name: str):
    import torchvision

    kw = {"num_classes": 10, "weights": None}
    if name in ("googlenet", "inception_v3"):
        kw.update(aux_logits=False, init_weights=True)
    size = 75 if name == "inception_v3" else 224 if name == "vit_b_16" else 32
    return getattr(torchvision.models, name)(**kw), size


def data(n: int, size: int):
    d = np.load(DATA)
    x = torch.from_numpy(d["x_train"][:n]).float().permute(0, 3, 1, 2) / 255.0
    xt = torch.from_numpy(d["x_test"][:32]).float().permute(0, 3, 1, 2) / 255.0
    mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
    x, xt = (x - mean) / std, (xt - mean) / std
    if size != 32:
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        xt = F.interpolate(xt, size=size, mode="bilinear", align_corners=False)
    return x, torch.from_numpy(d["y_train"][:n]), xt


def run_interpreter(buf: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=buf, num_threads=1)
    i = it.get_input_details()[0]["index"]
    it.resize_tensor_input(i, list(x.shape))
    it.allocate_tensors()
    it.set_tensor(i, x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def run_214(python: str, buf: bytes, x: np.ndarray) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d)
        (p / "m.tflite").write_bytes(buf)
        np.save(p / "x.npy", x)
        subprocess.run([python, "-c", _RUN, str(p / "m.tflite"), str(p / "x.npy"),
                        str(p / "y.npy")], check=True, capture_output=True)
        return np.load(p / "y.npy")


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def row(name: str, args) -> dict:
    t0 = time.time()
    out = {"model": name}
    torch.manual_seed(0)
    try:
        net, size = plain(name)
        net.eval()
        model = nest(net, residual=args.residual, nest_stem=args.nest_stem)
    except (EdgeSdkError, ValueError) as e:
        out.update(nested=f"refused: {str(e).splitlines()[0]}", seconds=time.time() - t0)
        return out
    # the width `edge-sdk export` records for 0.25 (each unit cut at its own group boundary;
    # exporters.export.snapped_widths): the slices below are exactly the exported ones
    out["label"] = snapped_widths(model, [0.25], log=lambda _: None)[0]
    if args.macs_only:  # goal 3's figures: MACs counted from each width's graph, nothing run
        macs, nbytes = {}, {}
        for w in WIDTHS:
            sl = model.truncate(w).eval()
            macs[w] = graph_stats(lower_point_slice(sl, (1, size, size, 3), "float")[0])["macs"]
            nbytes[w] = len(export_point_slice(sl, (1, size, size, 3), weights="float")[0])
        out.update(nested="yes", macs=macs, bytes=nbytes, seconds=time.time() - t0)
        return out
    x, y, xt = data(args.images, size)
    model.eval()
    with torch.no_grad():
        with model.width(1.0):
            out["width1"] = rel(model(xt).numpy(), net(xt).numpy())
    if args.steps:
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4)
        model.train()
        for step in range(args.steps):
            idx = torch.randint(0, len(x), (32,))
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        out["loss"] = float(loss)
    calib = [(x[i:i + 64], y[i:i + 64]) for i in range(0, min(256, len(x)), 64)]
    xn = xt.permute(0, 2, 3, 1).numpy().astype(np.float32).copy()
    fid, fid214, floor, macs, nbytes = 0.0, 0.0, 0.0, {}, {}
    for w in WIDTHS:
        sl = make_slice(model, w, calib).double().eval()
        with torch.no_grad():
            ref = sl(torch.from_numpy(xn).double().permute(0, 3, 1, 2)).numpy()
            # torch's own float32 against float64: how well-conditioned the slice is
            floor = max(floor, rel(sl.float()(torch.from_numpy(xn).permute(0, 3, 1, 2))
                                   .numpy(), ref))
        shape = (1, size, size, 3)
        buf, _ = export_point_slice(sl.float(), shape, weights="float")
        nbytes[w] = len(buf)
        fid = max(fid, rel(run_interpreter(buf, xn), ref))
        if args.tflite_runtime:
            fid214 = max(fid214, rel(run_214(args.tflite_runtime, buf, xn), ref))
        graph, _, _ = lower_point_slice(sl.float(), shape, "float")
        macs[w] = graph_stats(graph)["macs"]
    out.update(nested="yes", fidelity=fid, floor=floor, macs=macs, bytes=nbytes,
               seconds=time.time() - t0)
    if args.tflite_runtime:
        out["fidelity_214"] = fid214
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="*", default=MODELS)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--residual", default="inner", choices=["inner", "stage"])
    p.add_argument("--nest-stem", action="store_true")
    p.add_argument("--macs-only", action="store_true",
                   help="only nest and count each width's MACs (no training, no interpreter)")
    p.add_argument("--tflite-runtime", metavar="PYTHON", default=None,
                   help="a Python with tflite-runtime 2.14: every slice runs there too")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"| model | nested | width-1.0 vs source | fidelity (max over widths) | torch f32 "
          f"{'| on 2.14 ' if args.tflite_runtime else ''}| MACs 0.25 | 0.5 | 1 | "
          "0.25 / 1 | 0.25 exported as | KB 0.25 | 0.5 | 1 | mono | s |")
    print("|---" * (15 + bool(args.tflite_runtime)) + "|")
    for name in args.models:
        try:
            r = row(name, args)
        except Exception as e:  # a row that breaks is reported, the table goes on
            r = {"model": name, "nested": f"ERROR {type(e).__name__}: {str(e)[:200]}",
                 "seconds": 0.0}
        m = r.get("macs") or {}
        cells = [r["model"], r["nested"], f"{r['width1']:.1e}" if "width1" in r else "-",
                 f"{r['fidelity']:.1e}" if "fidelity" in r else "-",
                 f"{r['floor']:.1e}" if "floor" in r else "-"]
        if args.tflite_runtime:
            cells.append(f"{r['fidelity_214']:.1e}" if "fidelity_214" in r else "-")
        cells += [f"{m[w] / 1e6:.1f} M" if w in m else "-" for w in WIDTHS]
        b = r.get("bytes") or {}
        cells.append(f"{m[0.25] / m[1.0]:.{1 if args.macs_only else 0}%}" if m else "-")
        cells.append(f"{r['label']:.4g}" if "label" in r else "-")
        cells += [f"{b[w] / 1e3:.0f}" if w in b else "-" for w in WIDTHS]
        mono = bool(m and b) and all(d[u] < d[v] for d in (m, b)
                                     for u, v in zip(WIDTHS, WIDTHS[1:]))
        cells += ["yes" if mono else "NO" if m and b else "-",
                  f"{r['seconds']:.0f}"]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
