"""The SQS sampled store's categoricals (issue 21, docs/store.md §2): how many threshold bits
and how much pruning they need.

The store holds, per uncertain non-zero weight, its categorical over its window's components
(eq. 9 at the checkpoint's ``sample_tau``) as codebook indices + cumulative thresholds at 16
bits (exporters.store.sqs_categorical); a draw compares one 16-bit uniform
(edge_sdk.store.sampler.uniform_u16 at the weight's flat index) against them. Each
``--settings`` item ``B[:P]`` quantizes the cumulative probabilities to ``B`` bits (a draw
compares the uniform's top ``B`` bits: the same uniforms for every setting) after dropping
the entries whose probability is below ``P`` (renormalised; default 0: only what quantizes to
zero mass). A weight left with one entry keeps its point value (as the store does). S whole
networks are drawn per seed set (sample s: seed + s), batch norm re-collected per sample, and
the S-sample ensemble measured on the test split (torch eval); the reference is ``16`` (what
the store holds today).

Prints per setting and seed set: the categorical bytes (flags, counts, entries, thresholds),
uncertain weights and entries, accuracy, NLL, ECE and mean mutual information, then per
setting the mean over seed sets and the MI change against 16 bits (paired).

    python benchmarks/store_sqs.py --checkpoint runs/s3/fashion-ours/fashion_mnist/sqs/checkpoint.pt \\
        --settings 16,12,8,16:0.01,8:0.01 --seeds 0,100 --max-eval 1000
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from edge_sdk.store import stream_id
from edge_sdk.store.packing import bits_for
from edge_sdk.store.sampler import uniform_u16
from exporters.store import sqs_probabilities
from store_sigma import ensemble_quality, setup, summarise


def categorical(t: dict, tau: float, bits: int, prune: float):
    """Per non-zero weight: (flat positions, component values [n, K], alive [n, K],
    cumulative thresholds [n, K] at ``bits`` (the last alive entry's = 2**bits))."""
    pos, window, valid, phi = sqs_probabilities(t, tau, prune)
    comp = t["codebook"].float().cpu().numpy()[window]
    top = 1 << bits
    cum = np.rint(np.cumsum(phi, axis=1) * top).astype(np.int64)
    cum[:, -1] = top
    mass = np.diff(cum, axis=1, prepend=0)
    alive = (mass > 0) & valid
    return pos, comp, alive, cum


def sizes(alive: np.ndarray, bits: int, book_bits: int) -> tuple[int, int, int]:
    """(bytes, uncertain weights, entries) of the store's categorical arrays."""
    count = alive.sum(1)
    unc = count >= 2
    nu, ent = int(unc.sum()), int(count[unc].sum())
    count_bits = bits_for(max(int(count[unc].max(initial=2)) - 1, 1))  # as the store
    b = (alive.shape[0] + 7) // 8 + (nu * count_bits + 7) // 8 + (ent * book_bits + 7) // 8 \
        + (((ent - nu) * bits + 7) // 8 if bits <= 8 else 2 * (ent - nu))
    return b, nu, ent


def draw(mu: np.ndarray, pos, comp, alive, cum, bits: int, u16: np.ndarray) -> np.ndarray:
    """One sample of a layer: each uncertain weight takes the first alive entry whose
    cumulative threshold exceeds the uniform's top ``bits`` bits."""
    u = (u16[pos].astype(np.int64) >> (16 - bits))[:, None]
    hit = alive & (cum > u)
    j = hit.argmax(1)
    val = comp[np.arange(len(pos)), j]
    certain = alive.sum(1) < 2
    out = mu.reshape(-1).copy()
    out[pos] = np.where(certain, out[pos], val)
    return out.reshape(mu.shape)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--settings", default="16,12,8,16:0.01,8:0.01")
    p.add_argument("--seeds", default="0,100", help="seed sets (sample s: seed + s)")
    p.add_argument("--max-eval", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    ckpt, model, _, calib, xt, y, layers = setup(args)
    post = ckpt.get("posterior") or {}
    if post.get("kind") != "sqs":
        p.error("an SQS checkpoint is needed")
    tau = float(post["sample_tau"])
    mu = {n: layers[n].weight_mu.detach().cpu().numpy().astype(np.float32) for n in layers}
    book_bits = {}
    for n in layers:
        t = post["tensors"][n]
        comp = t["codebook"].float().cpu().numpy()[t["valid"].cpu().numpy().astype(bool)]
        m = t["mask"].cpu().numpy().astype(bool).reshape(mu[n].shape)
        book_bits[n] = bits_for(np.unique(np.concatenate([comp, mu[n][m]])).size)
    settings = [s for s in args.settings.split(",") if s]
    parsed = {s: (int(s.partition(":")[0]), float(s.partition(":")[2] or 0)) for s in settings}
    cats = {s: {n: categorical(post["tensors"][n], tau, *parsed[s]) for n in layers}
            for s in settings}
    seeds = [int(v) for v in args.seeds.split(",")]
    print(f"{args.checkpoint} (sqs, tau {tau:g}), width {args.width:g}, S = {args.samples}, "
          f"{len(y)} test samples, seed sets {seeds}", flush=True)
    for s in settings:
        tot = [sizes(cats[s][n][2], parsed[s][0], book_bits[n]) for n in layers]
        print(f"{s:>9}: categorical {sum(t[0] for t in tot):,} B, uncertain "
              f"{sum(t[1] for t in tot):,}, entries {sum(t[2] for t in tot):,} "
              f"(per layer B: {'/'.join(str(t[0]) for t in tot)})", flush=True)
    print(f"{'setting':>9}{'seed':>6}{'acc':>8}{'nll':>8}{'ece':>8}{'MI':>9}", flush=True)
    res: dict[str, list] = {s: [] for s in settings}
    for seed in seeds:
        u = {n: [uniform_u16(seed + k, stream_id(n), mu[n].size) for k in range(args.samples)]
             for n in layers}
        for s in settings:
            draws = ({n: torch.from_numpy(draw(mu[n], *cats[s][n], parsed[s][0], u[n][k]))
                      for n in layers} for k in range(args.samples))
            q = ensemble_quality(model, args.width, calib, xt, y, draws)
            res[s].append(q)
            print(f"{s:>9}{seed:>6}{q[0]:>8.4f}{q[1]:>8.4f}{q[2]:>8.4f}{q[3]:>9.5f}", flush=True)
    summarise(res, settings[0], 9)


if __name__ == "__main__":
    main()
