"""Training throughput: nested Bayesian network vs the same architecture as a plain network.

The baseline is the strongest honest one: the identical layer graph built from stock
``nn.Conv2d`` / ``nn.Linear`` + batch norm + ReLU (no weight noise, no masks, no KL), same data,
batch size, optimizer and thread count, measured in the same process, interleaved, so machine
noise hits both. Prints the median samples/s over repeats and the ratio (goal: <= 2.0x).

    python benchmarks/train_speed.py [--model nested_cnn_small] [--input-size 8] [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from trainer.layers import BayesNestedConv2d, BayesNestedLayer
from trainer.models import create_model


def deterministic_twin(model: nn.Module) -> nn.Module:
    """Replace every Bayesian nested block by its plain counterpart, in place on a copy."""
    import copy

    twin = copy.deepcopy(model)

    def plain(layer: BayesNestedLayer) -> nn.Module:
        if isinstance(layer, BayesNestedConv2d):
            core = nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size,
                             layer.stride, layer.padding, groups=layer.conv_groups,
                             bias=layer.bias is not None)
        else:
            core = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
        parts = [core] + ([layer.bn] if layer.bn is not None else [])
        parts += {"relu": [nn.ReLU()], "relu6": [nn.ReLU6()], None: []}[layer.activation]
        return nn.Sequential(*parts)

    def swap(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if isinstance(child, BayesNestedLayer):
                setattr(parent, name, plain(child))
            else:
                swap(child)

    swap(twin)
    return twin


def throughput(model: nn.Module, step, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(3):  # warm-up
        step(model, opt, x, y)
    t0 = time.perf_counter()
    for _ in range(steps):
        step(model, opt, x, y)
    return steps * len(x) / (time.perf_counter() - t0)


def bayes_step(model, opt, x, y, kappa_over_n=1e-4):
    loss = F.cross_entropy(model(x), y) + kappa_over_n * (model.weight_kl() + model.ordering_kl())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def plain_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="nested_cnn_small")
    p.add_argument("--input-size", type=int, default=8)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--width-mult", type=float, default=1.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = create_model(args.model, in_channels=args.channels, input_size=args.input_size,
                         width_mult=args.width_mult)
    twin = deterministic_twin(model)
    x = torch.randn(args.batch_size, args.channels, args.input_size, args.input_size)
    y = torch.randint(0, 10, (args.batch_size,))
    bayes, plain = [], []
    for _ in range(args.repeats):  # interleaved: drift on a shared machine hits both
        bayes.append(throughput(model, bayes_step, x, y, args.steps))
        plain.append(throughput(twin, plain_step, x, y, args.steps))
    mb, mp = statistics.median(bayes), statistics.median(plain)
    print(f"model {args.model} input {args.channels}x{args.input_size}x{args.input_size} "
          f"batch {args.batch_size} threads {args.threads} repeats {args.repeats} "
          f"x {args.steps} steps")
    print(f"{'network':<34}{'median samples/s':>18}{'min':>10}{'max':>10}")
    print(f"{'nested Bayesian (BN3)':<34}{mb:>18.0f}{min(bayes):>10.0f}{max(bayes):>10.0f}")
    print(f"{'plain deterministic (same graph)':<34}{mp:>18.0f}{min(plain):>10.0f}{max(plain):>10.0f}")
    print(f"slowdown (plain / Bayesian): {mp / mb:.2f}x   (goal <= 2.0x)")


if __name__ == "__main__":
    main()
