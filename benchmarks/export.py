"""Export a checkpoint and compare the slices: bytes, MACs, TFLite vs torch eager latency (batch 1,
1 thread, median of repeated invokes, measured in the same run), bundle bytes against the fp32
full model, export wall time, and quality per configuration (with OOD AUROC when given).

    python benchmarks/export.py --checkpoint runs/fashion_mnist/checkpoint.pt --out /tmp/bundle \
        [--ood-data npz:DIR/notmnist_test.npz] [--samples 8] [--max-eval 2000]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from edge_sdk.bundle import SCOPES, read_manifest
from exporters.export import ExportOptions, export_bundle
from exporters.measure import latency_ms, run_tflite
from exporters.slice import make_slice
from exporters.tflite import export_point_slice
from trainer import checkpoint as ckpt_io
from trainer.config import config_from_dict
from trainer.data import load_data
from trainer.evaluate import batches


def torch_latency_ms(model, x, repeats=100) -> float:
    with torch.no_grad():
        for _ in range(5):
            model(x)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(x)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--ood-data", default=None)
    p.add_argument("--max-eval", type=int, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    export_bundle(args.checkpoint, args.out,
                  ExportOptions(samples=args.samples, ood_data=args.ood_data, scopes=SCOPES,
                                max_eval=args.max_eval, force=True), progress=False)
    wall = time.perf_counter() - t0
    manifest = read_manifest(args.out)
    ckpt = ckpt_io.load_checkpoint(args.checkpoint)
    cfg = config_from_dict(ckpt["config"])
    model = ckpt_io.model_from_checkpoint(ckpt)
    data = load_data(cfg.data)
    calib = batches(data.train, cfg.data.calib_samples, cfg.seed, batch=256)
    x = data.test.x[:1]
    fp32_bytes = 4 * sum(m.numel() for n, m in model.named_parameters()
                         if n.endswith("weight_mu") or n.endswith("bias"))
    bundle_bytes = sum(f.bytes for f in manifest.file_entries())
    print(f"\nexport wall time {wall:.1f} s; bundle {bundle_bytes / 1024:.1f} KiB for "
          f"{len(manifest.configurations)} configurations; fp32 full model {fp32_bytes / 1024:.1f}"
          f" KiB; ratio {bundle_bytes / fp32_bytes:.2f}")
    print(f"\n{'config':<14}{'KiB':>8}{'MACs':>11}{'tflite ms':>10}{'torch ms':>9}{'speedup':>8}"
          f"{'acc':>7}{'acc T':>7}{'nll T':>7}{'ece':>7}{'ece T':>7}{'MI':>7}{'OOD':>7}{'MB':>6}")
    torch_ms = {}
    for c in manifest.configurations:
        if c.width not in torch_ms:
            torch_ms[c.width] = torch_latency_ms(make_slice(model, c.width, calib), x)
        t_ms = torch_ms[c.width] * c.invokes
        raw, cal = c.test["raw"], c.test["calibrated"]
        ood = cal.get("ood_auroc")
        print(f"{c.id:<14}{sum(f.bytes for f in c.files) / 1024:>8.1f}{c.macs:>11}"
              f"{c.latency_ms:>10.3f}{t_ms:>9.3f}{t_ms / c.latency_ms:>7.1f}x"
              f"{raw['accuracy']:>7.4f}{cal['accuracy']:>7.4f}{cal['nll']:>7.4f}{raw['ece']:>7.4f}"
              f"{cal['ece']:>7.4f}{cal['mutual_info']:>7.4f}"
              f"{'-' if ood is None else f'{ood:.4f}':>7}{c.memory_mb:>6.1f}")
    print("\ntorch ms = eager point slice per invoke x invokes (the head scope's torch figure is "
          "the point slice's); T = fitted temperature; MI = mean mutual information")

    # int8 weights: DEQUANTIZE -> float op (exact, the default) vs hybrid ops, same slices
    print(f"\n{'width':>6}{'dequantize ms':>15}{'hybrid ms':>11}{'hybrid/dequantize':>19}"
          f"{'hybrid max rel diff':>21}")
    xs = x.permute(0, 2, 3, 1).numpy()
    for w in sorted(torch_ms):
        sl = make_slice(model, w, calib)
        bufs = {r: export_point_slice(sl, [1, *xs.shape[1:]], r)[0] for r in ("dequantize", "hybrid")}
        ms = {r: latency_ms(b, xs[0], 200) for r, b in bufs.items()}
        outs = {r: run_tflite(b, data.test.x[:200].permute(0, 2, 3, 1).numpy()) for r, b in bufs.items()}
        diff = abs(outs["hybrid"] - outs["dequantize"]).max() / abs(outs["dequantize"]).max()
        print(f"{w:>6.3g}{ms['dequantize']:>15.3f}{ms['hybrid']:>11.3f}"
              f"{ms['hybrid'] / ms['dequantize']:>18.2f}x{diff:>21.4f}")


if __name__ == "__main__":
    main()
