"""The fx lowering + torch-free writer (issue 20) on every built-in model: TFLite (LiteRT) logits
against torch per width and weight route, and where the export time goes (lowering vs writing).

    python benchmarks/lowering.py [--width-mult 1.0] [--batch 8] [--repeats 5]

float       TFLite float32 vs torch float64 on the same folded network
dequantize  TFLite int8 x scale + DEQUANTIZE vs torch running the dequantized weights
            (and, beside it, vs the float network: the int8 grid's effect)
hybrid      int8 filters with activations quantized per invoke vs the float network

Untrained models with random ordering and batch-norm statistics (tests/support.randomise), so
truncation, keep-probability scales and folding are far from their initial values. Prints a
Markdown table; asserts nothing (tests/exporters/test_tflite.py and test_lowering.py do).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support import randomise  # noqa: E402
from timing import median_ms  # noqa: E402  (benchmarks/, the script's directory)

from edge_sdk.tflite.writer import write_tflite  # noqa: E402
from exporters.weights import with_graph_weights  # noqa: E402
from exporters.measure import run_tflite  # noqa: E402
from exporters.tflite import lower_point_slice, prepare_weights  # noqa: E402
from trainer.models import create_model  # noqa: E402

MODELS = {"nested_cnn_small": (8, 8, 1), "nested_vgg": (32, 32, 3),
          "nested_mobilenetv2": (32, 32, 3)}


def torch_logits(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x).double().permute(0, 3, 1, 2)).numpy()




def diff(a: np.ndarray, b: np.ndarray) -> str:
    d = np.abs(a - b).max()
    return f"{d:.2e} / {d / np.abs(b).max():.2e}"




def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width-mult", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    print("| model | width | route | max abs / rel vs torch | vs float network | lower ms | "
          "write ms | KiB |\n|---|---|---|---|---|---|---|---|")
    for name, hwc in MODELS.items():
        torch.manual_seed(0)
        model = create_model(name, width_mult=args.width_mult).double().eval()
        randomise(model, 1)
        x = np.random.default_rng(0).standard_normal((args.batch, *hwc)).astype(np.float32)
        for width in (0.25, 0.5, 1.0):
            small = model.truncate(width).eval()
            ref = torch_logits(small, x)
            for route in ("float", "dequantize", "hybrid"):
                lower_ms = median_ms(lambda: lower_point_slice(small, (1, *hwc), route),
                                     args.repeats)
                graph, arrays, _ = lower_point_slice(small, (1, *hwc), route)
                write_ms = median_ms(lambda: write_tflite(graph, arrays), args.repeats)
                buf = write_tflite(graph, arrays)
                out = run_tflite(buf, x)[:, 0]  # [N, 1, C] -> [N, C]
                if route == "dequantize":
                    own = diff(out, torch_logits(with_graph_weights(small, prepare_weights(small)), x))
                    grid = diff(out, ref)
                else:
                    own, grid = (diff(out, ref), "-") if route == "float" else ("-", diff(out, ref))
                print(f"| {name} | {width:g} | {route} | {own} | {grid} | {lower_ms:.1f} | "
                      f"{write_ms:.1f} | {len(buf) / 1024:.0f} |", flush=True)


if __name__ == "__main__":
    main()
