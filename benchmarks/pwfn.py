"""PWFN on a trained nested Bayesian network: quality before/after fixing, codebook size, and the
cost of clustering relative to an epoch of retraining.

Variants (same checkpoint, same data, same retraining budget, one process):
  posterior+mean   learned BN3 sigma, eq. 8's running-mean prefix (the default)
  posterior+strict learned sigma, the authors' code's per-weight rule
  pow2+mean        the paper's powers-of-two sigma initialisation (appendix eq. 8-9)
  uniform+mean     Table 1's "no prior" ablation
  posterior+mean+order1  centres restricted to single powers of two (omega <= 1)

    python benchmarks/pwfn.py --checkpoint runs/fashion_mnist/checkpoint.pt \
        [--epochs-per-round 1] [--train-subset 10000] [--variants posterior+mean,pow2+mean]

Without --checkpoint it trains one on Fashion-MNIST from --data PATH/fashion_mnist.npz (--train-epochs).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from trainer import checkpoint as ckpt_io
from trainer.config import config_from_dict, load_config
from trainer.data import load_data, subset
from trainer.quantize.pwfn import fix_weights_

VARIANTS = {
    "posterior+mean": dict(sigma_init="posterior", rule="mean"),
    "posterior+strict": dict(sigma_init="posterior", rule="strict"),
    "pow2+mean": dict(sigma_init="pow2", rule="mean"),
    "uniform+mean": dict(sigma_init="uniform", rule="mean"),
    # omega capped at 1: every centre a single power of two (the authors' code allows 4)
    "posterior+mean+order1": dict(sigma_init="posterior", rule="mean", max_order=1),
}
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "fashion_mnist.npz"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--data", default=str(DATA), help="fashion_mnist.npz (only without --checkpoint)")
    p.add_argument("--train-epochs", type=int, default=3, help="only without --checkpoint")
    p.add_argument("--epochs-per-round", type=int, default=1)
    p.add_argument("--train-subset", type=int, default=10000,
                   help="retraining samples per epoch (0 = the whole training split)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    if args.checkpoint:
        state = ckpt_io.load_checkpoint(args.checkpoint)
        cfg = config_from_dict(state["config"])
        model = ckpt_io.model_from_checkpoint(state)
        source = args.checkpoint
    else:
        if not Path(args.data).is_file():
            sys.exit(f"{args.data} is missing: pass --checkpoint, or --data PATH/fashion_mnist.npz")
        from trainer.train import train
        cfg = load_config("fashion_mnist", [f"data.source=npz:{args.data}",
                                            f"train.epochs={args.train_epochs}"])
        model = train(cfg, "runs/bench-pwfn-base", progress=False).model
        source = f"trained here, {args.train_epochs} epochs"
    data = load_data(cfg.data)
    if args.train_subset and args.train_subset < len(data.train):
        idx = np.random.default_rng(0).permutation(len(data.train))[: args.train_subset]
        data = replace(data, train=subset(data.train, idx, augment=data.train.augment))

    print(f"checkpoint: {source}; data {cfg.data.source}; retraining on {len(data.train)} "
          f"samples, {args.epochs_per_round} epoch(s) per round, {args.samples} ensemble samples")
    rows = []
    for name in args.variants.split(","):
        pw = replace(cfg.quantize.pwfn, epochs_per_round=args.epochs_per_round,
                     samples=args.samples, **VARIANTS[name])
        m = copy.deepcopy(model)
        t0 = time.perf_counter()
        res = fix_weights_(m, pw, data, cfg, progress=False, log=lambda *a: None)
        wall = time.perf_counter() - t0
        cluster = [r["cluster_seconds"] for r in res.rounds]
        epoch = [r["epoch_seconds"] for r in res.rounds if r["epoch_seconds"]]
        rows.append((name, res, wall, statistics.median(cluster), statistics.median(epoch)))

    print(f"\n{'variant':<18}{'width':>6}{'acc before':>11}{'acc point':>10}{'acc ens':>9}"
          f"{'ece before':>11}{'ece point':>10}{'ece ens':>9}")
    for name, res, *_ in rows:
        for w in sorted(res.after_point):
            b, pt, en = res.before[w], res.after_point[w], res.after_ensemble[w]
            print(f"{name:<18}{w:>6.3g}{b['accuracy']:>11.4f}{pt['accuracy']:>10.4f}"
                  f"{en['accuracy']:>9.4f}{b['ece']:>11.4f}{pt['ece']:>10.4f}{en['ece']:>9.4f}")
    print(f"\n{'variant':<18}{'unique':>7}{'entropy bits':>13}{'packed KiB':>11}"
          f"{'cluster s/round':>16}{'epoch s':>9}{'ratio':>7}{'wall s':>8}")
    for name, res, wall, cl, ep in rows:
        print(f"{name:<18}{res.unique_values:>7}{res.entropy_bits:>13.3f}"
              f"{res.packed_bytes / 1024:>11.1f}{cl:>16.2f}{ep:>9.2f}{cl / ep:>7.3f}{wall:>8.0f}")
    print("\nratio = median clustering time per round / median retraining epoch (goal <= 0.1)")


if __name__ == "__main__":
    main()
