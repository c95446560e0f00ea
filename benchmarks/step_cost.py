"""Cost of one training step per regime, measured in one process (issue 17, goal 4).

Time to the bundle is steps x cost per step, so the per-step cost is what a regime choice
changes; measured here interleaved in one process (machine noise hits every row alike), median of
repeats, on random data of the config's input shape:

  plain      the config's graph from stock layers, one pass (the deterministic baseline)
  US-Nets    the same graph slimmable: max + min + 2 random widths, in-place distillation
  ours ...   the nested model through trainer.regime.train_step: one Downhill pass or the
             sandwich rule (full + Downhill or a uniform middle width + the narrowest served
             width), with posterior means
             (deterministic: what training runs with bayes.noise_start 1) or weight noise
             (local reparameterisation: what PWFN's fine-tuning runs)

    python benchmarks/step_cost.py [--config cifar10] [--width-mult 0.5] [--threads 2]
        [--channels-last]

``--channels-last`` runs what ``train.channels_last`` trains: NHWC weights and images for ours'
passes at the posterior means (weight-noise passes keep NCHW, where they are faster) and for the
baselines, so the ratios compare methods, not layouts.
Rows are timed round-robin (every row once per round, median over the rounds), so a slow
stretch of the machine hits every row alike.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline_models

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import baseline_models as BM  # noqa: E402
from timing import median_ms  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.device import as_channels_last, channels_last_  # noqa: E402
from trainer.models import create_model  # noqa: E402
from trainer.regime import train_step  # noqa: E402




def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="cifar10")
    p.add_argument("--width-mult", type=float, default=None, help="default: the config's")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--channels-last", action="store_true", help="each row in the layout train.channels_last trains it in")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, [] if args.width_mult is None
                      else [f"model.width_mult={args.width_mult}"])
    args.width_mult = cfg.model.width_mult
    size, channels = (28, 1) if cfg.model.name == "nested_cnn_small" else (32, 3)
    arch = dict(num_classes=10, in_channels=channels, input_size=size)
    x = torch.randn(args.batch_size, channels, size, size)
    y = torch.randint(0, 10, (args.batch_size,))
    torch.manual_seed(0)
    nested = create_model(cfg.model.name, width_mult=args.width_mult, **arch,
                          **cfg.model.kwargs)
    nested.set_mask_scope("batch")
    plain = BM.plain_net(cfg, 1.0, **arch)
    slim = BM.slimmable_net(BM.plain_net(cfg, 1.0, **arch))
    gen = torch.Generator().manual_seed(0)
    narrowest = min(cfg.train.eval_widths)
    xn, means_net = x, nested  # what the passes at the posterior means see, and run
    if args.channels_last:
        xn = as_channels_last(x)
        channels_last_(plain)
        channels_last_(slim)
        # a noise-free recipe trains NHWC weights too (train.channels_last); noisy rows keep NCHW
        means_net = channels_last_(copy.deepcopy(nested))

    def plain_step():
        plain.train()
        F.cross_entropy(plain(xn), y).backward()

    def slim_step():  # benchmarks/baseline_models.train_slimmable's step
        slim.train()
        BM.set_width(slim, 1.0)
        logits = slim(xn)
        F.cross_entropy(logits, y).backward()
        soft = torch.softmax(logits.detach(), -1)
        for w in [narrowest, *(narrowest + (1 - narrowest) * torch.rand(2, generator=gen)).tolist()]:
            BM.set_width(slim, w)
            (-(soft * torch.log_softmax(slim(xn), -1)).sum(1).mean()).backward()
        BM.set_width(slim, 1.0)

    def ours(sandwich: bool, noise: bool, sampled: str = "downhill"):
        def step():
            net = nested if noise else means_net
            net.train()
            train_step(net, net, x if noise else xn, y, mask_coupling="layer",
                       sandwich=sandwich,
                       distill=True, noise=noise, regularizer=lambda: torch.zeros(()),
                       min_width=narrowest, sampled_width=sampled)
        return step

    def full_alone():  # train.nested_start's warm-up: one full-width pass on the labels
        means_net.train()
        with means_net.width(1.0, scaled=False), means_net.weight_mode("mean"):
            F.cross_entropy(means_net(xn), y).backward()

    rows = {"plain (one pass)": plain_step, "US-Nets (4 passes)": slim_step,
            "ours, full width alone (nested_start), means": full_alone,
            "ours, Downhill pass, means": ours(False, False),
            "ours, Downhill pass, noise": ours(False, True),
            "ours, sandwich, means (training)": ours(True, False),
            "ours, sandwich, noise": ours(True, True),
            # train.sampled_width uniform (the shipped recipe): the middle pass runs one
            # fixed width, so it computes only that width's channels
            "ours, sandwich + uniform, means (training)": ours(True, False, "uniform"),
            "ours, sandwich + uniform, noise (PWFN fine-tuning)": ours(True, True, "uniform")}
    for fn in rows.values():  # warm-up
        fn()
    times = {name: [] for name in rows}
    for _ in range(args.repeats):
        for name, fn in rows.items():
            times[name].append(median_ms(fn, 1))
    cost = {name: statistics.median(ts) / 1e3 for name, ts in times.items()}
    print(f"{cfg.model.name} width_mult {args.width_mult}, batch {args.batch_size}, "
          f"{args.threads} threads, {'NHWC' if args.channels_last else 'NCHW'}, "
          f"median of {args.repeats} round-robin rounds")
    base = cost["plain (one pass)"]
    for name, s in cost.items():
        print(f"{name:<52}{1000 * s:>9.0f} ms/step{s / base:>7.2f}x plain")
    # the config's training, epoch-weighted: the full width alone before nested_start, its
    # regime after (time to the bundle adds the quantizer's fine-tuning)
    t = cfg.train
    regime = ("ours, sandwich + uniform, means (training)" if t.sampled_width == "uniform"
              else "ours, sandwich, means (training)") if t.sandwich else "ours, Downhill pass, means"
    train = (t.nested_start * cost["ours, full width alone (nested_start), means"]
             + (1 - t.nested_start) * cost[regime])
    print(f"{cfg.name}'s training per step on average (nested_start {t.nested_start:g}, then "
          f"{regime!r}): {1000 * train:.0f} ms = {train / cost['US-Nets (4 passes)']:.2f}x "
          "US-Nets' step")


if __name__ == "__main__":
    main()
