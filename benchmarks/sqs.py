"""SQS on a trained nested Bayesian network: accuracy and ECE per width at 16x and 32x
(the paper's rate, eq. 14), greedy (eq. 34) vs Bayesian averaging (eq. 10) with M = 4 and 8.

    python benchmarks/sqs.py --checkpoint runs/fashion_mnist/checkpoint.pt [--epochs 2]
        [--train-subset 10000] [--settings 4x0.5,2x0.5]

Screening a setting (issue 17's fine-tuning lr): ``--eval val`` measures on the validation
split instead of the test split, ``--lrs`` runs each Adam lr per setting, e.g.
``--settings 4x0.5 --epochs 1 --train-subset 10000 --lrs 1e-3,3e-4,1e-4 --eval val --samples 1``.
"""
from __future__ import annotations

import argparse
import copy
import time
from dataclasses import replace

import numpy as np
import torch

from trainer import checkpoint as ckpt_io
from trainer.config import config_from_dict
from trainer.data import load_data, subset
from trainer.evaluate import batches
from trainer.quantize.sqs import _evaluate, sample_from_posterior, sqs_


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--epochs", type=int, default=2, help="SQS fine-tuning epochs")
    p.add_argument("--train-subset", type=int, default=10000)
    p.add_argument("--settings", default="4x0.5,2x0.5", help="bits x nonzero, comma separated")
    p.add_argument("--samples", default="4,8", help="ensemble sizes to evaluate (0: none)")
    p.add_argument("--lrs", default=None, help="Adam lrs to screen (default: the config's)")
    p.add_argument("--eval", choices=("test", "val"), default="test",
                   help="split every figure is measured on (screen on val, never on test)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    state = ckpt_io.load_checkpoint(args.checkpoint)
    cfg = config_from_dict(state["config"])
    model = ckpt_io.model_from_checkpoint(state)
    data = load_data(cfg.data)
    if args.train_subset and args.train_subset < len(data.train):
        idx = np.random.default_rng(0).permutation(len(data.train))[: args.train_subset]
        data = replace(data, train=subset(data.train, idx, augment=data.train.augment))
    if args.eval == "val":
        data = replace(data, test=data.val)  # sqs_ reports on data.test
    widths = cfg.train.eval_widths
    calib = batches(data.train, cfg.data.calib_samples, cfg.seed)
    test = batches(data.test)
    sample_counts = [m for m in map(int, args.samples.split(",")) if m > 0]  # 0: point only
    print(f"checkpoint {args.checkpoint}; {cfg.data.source}; fine-tuning {args.epochs} epoch(s) "
          f"on {len(data.train)} samples; {args.eval} split {len(data.test)}")
    rows = []
    lrs = [float(v) for v in args.lrs.split(",")] if args.lrs else [cfg.quantize.sqs.lr]
    for setting, lr in [(s, lr) for s in args.settings.split(",") for lr in lrs]:
        bits, nonzero = setting.split("x")
        sq = replace(cfg.quantize.sqs, bits=int(bits), nonzero=float(nonzero),
                     epochs=args.epochs, samples=0, lr=lr, subset=None)
        if args.lrs:
            setting = f"{setting}@{lr:g}"
        m = copy.deepcopy(model)
        t0 = time.perf_counter()
        res = sqs_(m, sq, data, cfg, progress=False, log=lambda *a: None)
        wall = time.perf_counter() - t0
        gen = torch.Generator().manual_seed(0)
        bayes = {}
        for count in sample_counts:
            sets = [sample_from_posterior(res.posterior, sq.sample_tau, gen) for _ in range(count)]
            bayes[count] = _evaluate(m, calib, test, widths, sets)
        rows.append((setting, res, bayes, wall))

    head = f"{'bits x nonzero':<15}{'rate':>6}{'width':>6}{'acc fp':>8}{'acc greedy':>11}"
    head += "".join(f"{'acc M=' + str(c):>9}" for c in sample_counts)
    head += f"{'ece fp':>8}{'ece greedy':>11}" + "".join(f"{'ece M=' + str(c):>9}" for c in sample_counts)
    print("\n" + head)
    for setting, res, bayes, _ in rows:
        for w in sorted(res.greedy):
            b, g = res.before[w], res.greedy[w]
            line = f"{setting:<15}{res.rate:>5.0f}x{w:>6.3g}{b['accuracy']:>8.4f}{g['accuracy']:>11.4f}"
            line += "".join(f"{bayes[c][w]['accuracy']:>9.4f}" for c in sample_counts)
            line += f"{b['ece']:>8.4f}{g['ece']:>11.4f}"
            line += "".join(f"{bayes[c][w]['ece']:>9.4f}" for c in sample_counts)
            print(line)
    print(f"\n{'bits x nonzero':<15}{'kept':>9}{'of':>9}{'bits/weight':>12}{'packed KiB':>11}"
          f"{'drop@1.0 (pt)':>14}{'max phi<0.99':>13}{'wall s':>8}")
    for setting, res, bayes, wall in rows:
        drop = 100 * (res.before[1.0]["accuracy"] - res.greedy[1.0]["accuracy"])
        unc = list(res.uncertain_fraction.values())[-1]
        print(f"{setting:<15}{res.nonzero_kept:>9}{res.total_weights:>9}{res.bits_per_weight:>12.2f}"
              f"{res.packed_bytes / 1024:>11.1f}{drop:>14.2f}{unc:>13.4f}{wall:>8.0f}")
    print("\nrate = the paper's 32 / log2 K x 1 / non-zero; bits/weight = ceil(log2 of the distinct "
          "codebook values per tensor), up to 4K values with four windows; packed = mask bits + "
          "index bits of kept weights + fp32 codebooks")


if __name__ == "__main__":
    main()
