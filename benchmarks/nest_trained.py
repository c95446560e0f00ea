"""Issue 35, goal 4: nest a *trained* network. A plain torchvision resnet18 (``--cifar-stem``: the
usual CIFAR variant, a 3x3 stride-1 stem and no max pool) trained N epochs on cifar10_dev, nested
by ``trainer.nest`` (width 1.0 is the trained network itself) and fine-tuned M epochs, against the
same nested network trained N + M epochs from scratch: test accuracy per width (batch norms
re-collected per width on 512 training images, torch eval). Rows are printed as each arm ends.

Both nested arms use one loop: SGD, a sampled pass (Downhill masks; the weights at their
means unless ``--weight-noise``, which samples them and doubles every conv's cost) plus the
narrowest width's pass each step (the sandwich rule's two ends), cross-entropy only (no KL: a
benchmark of where the weights start, not of the Bayesian regime). ``--parallel`` runs the
from-scratch arm in a second process (``--threads`` each) next to the trained -> nested arm.
Not in CI.

A user with ImageNet weights takes the same path, with the download in place of the first arm::

    import torch, torchvision, trainer
    net = torchvision.models.resnet18(weights=torchvision.models.ResNet18_Weights.IMAGENET1K_V1)
    net.fc = torch.nn.Linear(net.fc.in_features, 10)   # the task's classes (a fresh head)
    model = trainer.nest(net)          # model.width(1.0) equals net (eval mode), before training
    # fine-tune: this script's train(model, ..., nested=True), or edge-sdk train with
    # model.name=<module>:<factory> naming a function that returns trainer.nest(net) or net

Keep the ImageNet stem (7x7 stride 2 + max pool) when loading ImageNet weights, and feed inputs
normalised as at pretraining; ``--cifar-stem`` is for training from scratch at 32x32.

    .venv/bin/python benchmarks/nest_trained.py --cifar-stem --epochs 2 --finetune 1 \
        --images 8000 --test 5000 --threads 1 --parallel
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporters.slice import make_slice  # noqa: E402
from trainer.data import crop_flip_batch  # noqa: E402
from trainer.nesting import nest  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10_dev.npz"
WIDTHS = (0.25, 0.5, 1.0)


def load(n: int, n_test: int):
    d = np.load(DATA)
    x = torch.from_numpy(d["x_train"][:n]).float().permute(0, 3, 1, 2) / 255.0
    xt = torch.from_numpy(d["x_test"][:n_test]).float().permute(0, 3, 1, 2) / 255.0
    mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
    return ((x - mean) / std, torch.from_numpy(d["y_train"][:n]),
            (xt - mean) / std, torch.from_numpy(d["y_test"][:n_test]))


def plain_resnet18(cifar_stem: bool):
    import torchvision

    net = torchvision.models.resnet18(num_classes=10)
    if cifar_stem:  # 3x3 stride-1 stem, no max pool: the usual CIFAR variant
        net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        net.maxpool = torch.nn.Identity()
    return net


def train(model, x, y, epochs: int, lr: float, nested: bool, batch: int = 128,
          noise: bool = False) -> None:
    if nested and not noise:
        for m in model.bayes_layers():
            m.mode = "mean"  # masks sampled, weights at their means (None: auto)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    steps = epochs * (len(x) // batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x))
        for i in range(len(x) // batch):
            idx = perm[i * batch:(i + 1) * batch]
            xb, yb = crop_flip_batch(x[idx]), y[idx]
            loss = F.cross_entropy(model(xb), yb)
            if nested:  # the narrowest width too (the sandwich rule's other end)
                with model.width(model.min_width(), scaled=False):
                    loss = loss + F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()


@torch.no_grad()
def accuracy(model, x, y, calib) -> dict[float, float]:
    out = {}
    for w in WIDTHS:
        sl = make_slice(model, w, calib).eval()
        pred = torch.cat([sl(x[i:i + 500]).argmax(1) for i in range(0, len(x), 500)])
        out[w] = float((pred == y).float().mean())
    return out


def scratch_arm(args) -> tuple[dict[float, float], float]:
    """The same nested network trained N + M epochs from scratch: (accuracy per width, seconds)."""
    torch.set_num_threads(args.threads)
    x, y, xt, yt = load(args.images, args.test)
    calib = [(x[i:i + 128], y[i:i + 128]) for i in range(0, 512, 128)]
    t = time.time()
    torch.manual_seed(0)
    scratch = nest(plain_resnet18(args.cifar_stem))
    train(scratch, x, y, args.epochs + args.finetune, args.lr, nested=True,
          noise=args.weight_noise)
    return accuracy(scratch, xt, yt, calib), time.time() - t


def row(label: str, acc: dict[float, float], secs: str) -> None:
    print(f"| {label} | " + " | ".join(f"{acc[w]:.4f}" for w in WIDTHS) + f" | {secs} |",
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2, help="N: plain training epochs")
    p.add_argument("--finetune", type=int, default=1, help="M: epochs after nesting")
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--cifar-stem", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--weight-noise", action="store_true",
                   help="sample the weights in the nested arms' training (2x the cost)")
    p.add_argument("--parallel", action="store_true",
                   help="run the from-scratch arm in a second process at the same time")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    n, m = args.epochs, args.finetune
    pool = future = None
    if args.parallel:
        import concurrent.futures
        import multiprocessing

        pool = concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"))
        future = pool.submit(scratch_arm, args)
    torch.manual_seed(0)
    x, y, xt, yt = load(args.images, args.test)
    calib = [(x[i:i + 128], y[i:i + 128]) for i in range(0, 512, 128)]
    t0 = time.time()
    plain = plain_resnet18(args.cifar_stem)
    train(plain, x, y, n, args.lr, nested=False)
    plain.eval()
    with torch.no_grad():
        plain_acc = float((plain(xt).argmax(1) == yt).float().mean())
    nested = nest(plain)
    with torch.no_grad():
        nested.eval()
        with nested.width(1.0):
            same = float((nested(xt[:64]) - plain(xt[:64])).abs().max()
                         / plain(xt[:64]).abs().max())
    print(f"resnet18 ({'CIFAR' if args.cifar_stem else 'ImageNet'} stem), cifar10_dev "
          f"{args.images} training / {args.test} test images; plain after {n} epochs: "
          f"{plain_acc:.4f} ({time.time() - t0:.0f} s); nested at width 1.0 vs the trained "
          f"network: {same:.1e} relative", flush=True)
    print("| arm | " + " | ".join(f"acc {w:g}" for w in WIDTHS) + " | s |")
    print("|---" * (len(WIDTHS) + 2) + "|", flush=True)
    row(f"trained {n} + nested, no fine-tune", accuracy(nested, xt, yt, calib), "-")
    train(nested, x, y, m, args.lr / 2, nested=True, noise=args.weight_noise)
    row(f"trained {n} + nested + {m} fine-tune", accuracy(nested, xt, yt, calib),
        f"{time.time() - t0:.0f}")
    fresh, secs = future.result() if future is not None else scratch_arm(args)
    row(f"nested from scratch, {n + m} epochs", fresh, f"{secs:.0f}")
    if pool is not None:
        pool.shutdown()


if __name__ == "__main__":
    main()
