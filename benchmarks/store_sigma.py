"""The store's sigma codebook (issue 21, docs/store.md §2): how many bits per weight sigma needs.

For each ``--bits`` value the Gaussian/PWFN posterior's sigma is put on a per-layer codebook of
2**bits log-spaced values (exporters.store.encode_sigma) and S whole networks are drawn with the
device's sampler (edge_sdk.store.sampler, the same eps for every setting), batch norm
re-collected per sample, and the S-sample ensemble measured on the test split (torch eval, the
point of comparison being the exact float32 sigma with the same eps). Prints one row per
setting: sigma bytes in the store, accuracy, NLL, ECE and mean mutual information.

    python benchmarks/store_sigma.py --checkpoint runs/demo/train/checkpoint.pt [--samples 8]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from edge_sdk import metrics as M
from edge_sdk.store import normal, stream_id
from edge_sdk.store.materialize import decode_point, sample_seed, sample_weights
from exporters.slice import make_slice, posterior_kind
from exporters.store import build_store
from trainer import checkpoint as ckpt_io
from trainer.config import config_from_dict
from trainer.data import load_data, nhwc_inputs
from trainer.evaluate import batches
from trainer.layers import BayesNestedLayer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--bits", default="1,2,3,4,6,8")
    p.add_argument("--max-eval", type=int, default=2000)
    args = p.parse_args()
    torch.set_num_threads(2)
    ckpt = ckpt_io.load_checkpoint(args.checkpoint)
    kind = posterior_kind(ckpt)
    cfg = config_from_dict(ckpt["config"])
    model = ckpt_io.model_from_checkpoint(ckpt).eval()
    spec = ckpt_io.input_spec(ckpt)
    data = load_data(cfg.data, spec)
    calib = batches(data.train, min(cfg.data.calib_samples, 1024), cfg.seed, batch=256)
    x, y = nhwc_inputs(data.test, args.max_eval)
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
    names = [n for n, m in model.named_modules() if isinstance(m, BayesNestedLayer)]
    print(f"{args.checkpoint} ({kind}), width {args.width:g}, S = {args.samples}, "
          f"{len(y)} test samples")
    print(f"{'sigma':>8}{'KiB':>9}{'acc':>8}{'nll':>8}{'ece':>8}{'MI':>9}")

    def row(label, kib, draws):
        probs = []
        for ws in draws:
            sl = make_slice(model, args.width, calib, ws)
            with torch.no_grad():
                probs.append(torch.softmax(sl(xt).double(), -1).numpy())
        probs = np.stack(probs)
        mean = probs.mean(0)
        s = M.summarize(mean, y)
        mi = float(M.mutual_information(probs).mean())
        print(f"{label:>8}{kib:>9.1f}{s['accuracy']:>8.4f}{s['nll']:>8.4f}{s['ece']:>8.4f}"
              f"{mi:>9.5f}")

    build = None
    for bits in [int(b) for b in args.bits.split(",")]:
        build = build_store(model, ckpt, kind, [args.width], calib, list(spec.shape),
                            samples=args.samples, sigma_bits=bits)
        kib = sum(a.nbytes for k, a in build.store.arrays.items() if "/sigma_" in k) / 1024
        row(f"{bits} bit", kib, [{n: torch.from_numpy(sample_weights(build.store, n, s))
                                  for n in names} for s in range(args.samples)])
    post = ckpt.get("posterior") or {}
    layers = dict(model.named_modules())
    exact = []
    for s in range(args.samples):
        ws = {}
        for n in names:
            mu = decode_point(build.store, n)
            sig = (post["tensors"][f"{n}.weight"]["sigma"] if kind == "pwfn"
                   else layers[n].weight_sigma).detach().numpy().astype(np.float32)
            eps = normal(sample_seed(build.store.index, s), stream_id(n), mu.size)
            ws[n] = torch.from_numpy((mu.reshape(-1) + sig.reshape(-1) * eps).reshape(mu.shape))
        exact.append(ws)
    row("float32", sum(4 * layers[n].weight_mu.numel() for n in names) / 1024, exact)


if __name__ == "__main__":
    main()
