"""The store's sigma coding (issue 21, docs/store.md §2): how many bits per weight sigma needs.

Each ``--codings`` setting puts every layer's Gaussian/PWFN sigma on a per-layer codebook
(exporters.sigma_code) and S whole networks are drawn with the device's sampler
(edge_sdk.store.sampler: ``mu_dec + sigma * eps``, the same eps for every setting, mu_dec the
store's decoded point weights), batch norm re-collected per sample, and the S-sample ensemble
measured on the test split (torch eval; the reference is the exact float32 sigma with the same
eps). Settings:

    v2:B       the version-2 coding: 2**B log-spaced values of sigma (exporters.store.encode_sigma)
    abs:B      absolute, a 2**B-level Lloyd-Max codebook of log sigma (cells' mean log;
               absr:B the cells' RMS)
    rel:B      relative, a 2**B-level Lloyd-Max codebook of log(sigma / max(|mu_dec|, step/2))
               (relr:B the cells' RMS)
    auto:T     what the exporter stores (exporters.sigma_code.code_sigma): per layer the
               relative coding at 0 or 1 bits if its RMS log error is <= T (default 0.15),
               else v2:4

Prints per setting and seed set: sigma bytes (indices + codebooks), the bits per layer, accuracy,
NLL, ECE and mean mutual information, then per setting the mean over seed sets and the MI
change against float32 (paired: the same eps).

    python benchmarks/store_sigma.py --checkpoint runs/demo/train/checkpoint.pt \
        --codings v2:4,v2:3,rel:3,rel:2,auto:0.12 --seeds 0,100,200
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from edge_sdk.answers import metrics as M
from edge_sdk.store import normal, stream_id
from edge_sdk.store.decode import decode_point, sigma_reference
from exporters.sigma_code import absolute_code, code_sigma, encode_sigma, relative_code
from exporters.slice import make_slice, posterior_kind
from exporters.store import build_store
from trainer import checkpoint as ckpt_io
from trainer.config import config_from_dict
from trainer.data import load_data, nhwc_inputs
from trainer.evaluate import batches
from trainer.layers import BayesNestedLayer


def coded(setting: str, sig: np.ndarray, mu: np.ndarray, step: np.ndarray):
    """(decoded sigma float32 flat, index bits, bytes) of one layer under ``setting``."""
    kind, _, arg = setting.partition(":")
    if kind == "float32":
        return sig.reshape(-1).astype(np.float32), 32, 4 * sig.size
    if kind == "v2":
        book, idx = encode_sigma(sig, int(arg))
        bits = (book.size - 1).bit_length()
        return book[idx], bits, (bits * sig.size + 7) // 8 + 4 * book.size
    centre = "rms" if kind.endswith("r") else "geo"
    if kind in ("abs", "absr"):
        c = absolute_code(sig, int(arg), centre)
    elif kind in ("rel", "relr"):
        c = relative_code(sig, mu, step, int(arg), centre)
    elif kind == "auto":
        c = code_sigma(sig, mu, step, bits=4, rel_tol=float(arg))
    else:
        raise SystemExit(f"unknown setting {setting!r}")
    ref = sigma_reference(mu, step) if c.coding == "relative" else None
    return c.decode(ref), c.bits, (c.bits * sig.size + 7) // 8 + 4 * c.book.size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--codings", default="v2:4,v2:3,rel:3,rel:2,auto:0.12")
    p.add_argument("--seeds", default="0,100,200", help="seed sets (sample s: seed + s)")
    p.add_argument("--max-eval", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    ckpt, model, spec, calib, xt, y, layers = setup(args)
    kind = posterior_kind(ckpt)
    store = build_store(model, ckpt, kind, [args.width], calib, list(spec.shape)).store
    post = ckpt.get("posterior") or {}
    mu = {n: decode_point(store, n) for n in layers}
    step = {n: np.asarray(store.array(f"{n}/step"), np.float32) for n in layers}
    sig = {n: (post["tensors"][f"{n}.weight"]["sigma"] if kind == "pwfn"
               else layers[n].weight_sigma).detach().cpu().numpy().astype(np.float32)
           for n in layers}
    seeds = [int(v) for v in args.seeds.split(",")]
    settings = ["float32"] + [s for s in args.codings.split(",") if s]
    print(f"{args.checkpoint} ({kind}), width {args.width:g}, S = {args.samples}, "
          f"{len(y)} test samples, seed sets {seeds}", flush=True)
    print(f"{'sigma':>11}{'seed':>6}{'KiB':>8}  {'bits per layer':<16}{'acc':>8}{'nll':>8}"
          f"{'ece':>8}{'MI':>9}", flush=True)
    res: dict[str, list] = {s: [] for s in settings}
    for seed in seeds:
        eps = {n: [normal(seed + s, stream_id(n), mu[n].size) for s in range(args.samples)]
               for n in layers}
        for setting in settings:
            got = {n: coded(setting, sig[n], mu[n], step[n]) for n in layers}
            draws = ({n: torch.from_numpy((mu[n].reshape(-1) + got[n][0] * eps[n][s])
                                          .astype(np.float32).reshape(mu[n].shape))
                      for n in layers} for s in range(args.samples))
            q = ensemble_quality(model, args.width, calib, xt, y, draws)
            kib = sum(g[2] for g in got.values()) / 1024
            bits = "/".join(str(g[1]) for g in got.values())
            res[setting].append(q)
            print(f"{setting:>11}{seed:>6}{kib:>8.1f}  {bits:<16}{q[0]:>8.4f}"
                  f"{q[1]:>8.4f}{q[2]:>8.4f}{q[3]:>9.5f}", flush=True)
    summarise(res, "float32", 11)


def setup(args):
    """(checkpoint, its model in eval mode, input spec, BN calibration batches, the first
    ``args.max_eval`` test inputs [N, C, H, W] and labels, its Bayesian layers by name) at
    ``args.threads`` torch threads."""
    torch.set_num_threads(args.threads)
    ckpt = ckpt_io.load_checkpoint(args.checkpoint)
    cfg = config_from_dict(ckpt["config"])
    model = ckpt_io.model_from_checkpoint(ckpt).eval()
    spec = ckpt_io.input_spec(ckpt)
    data = load_data(cfg.data, spec)
    calib = batches(data.train, min(cfg.data.calib_samples, 1024), cfg.seed, batch=256)
    x, y = nhwc_inputs(data.test, args.max_eval)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, BayesNestedLayer)}
    return ckpt, model, spec, calib, torch.from_numpy(x).permute(0, 3, 1, 2), y, layers


def ensemble_quality(model, width: float, calib, xt: torch.Tensor, y: np.ndarray,
                     draws) -> tuple[float, float, float, float]:
    """(accuracy, NLL, ECE, mean mutual information) of the ensemble of the networks
    ``draws`` (weight sets), each at ``width`` with its own batch norm re-collected."""
    probs = []
    for ws in draws:
        sl = make_slice(model, width, calib, ws)
        with torch.no_grad():
            probs.append(torch.softmax(sl(xt).double(), -1).numpy())
    probs = np.stack(probs)
    m = M.summarize(probs.mean(0), y)
    return m["accuracy"], m["nll"], m["ece"], float(M.mutual_information(probs).mean())


def summarise(res: dict[str, list], ref_key: str, pad: int) -> None:
    """Per setting the mean over seed sets and the paired change against ``ref_key``."""
    print(f"mean over seed sets; MI change vs {ref_key} per seed set (paired)")
    ref = np.array(res[ref_key])
    for setting, rows in res.items():
        r = np.array(rows)
        d = 100 * (r[:, 3] / ref[:, 3] - 1)
        print(f"{setting:>{pad}}  acc {r[:, 0].mean():.4f} nll {r[:, 1].mean():.4f} "
              f"(d {np.mean(r[:, 1] - ref[:, 1]):+.4f}) ece {r[:, 2].mean():.4f} "
              f"(d {np.mean(r[:, 2] - ref[:, 2]):+.4f}) MI {r[:, 3].mean():.5f} "
              f"dMI {' '.join(f'{v:+.1f}%' for v in d)} (mean {d.mean():+.1f}%)")


if __name__ == "__main__":
    main()
