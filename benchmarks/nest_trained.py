"""Issue 35, goal 4: nest a *trained* network. A plain torchvision resnet18 trained N epochs on
cifar10_dev, nested by ``trainer.nest`` (width 1.0 is the trained network itself) and fine-tuned
M epochs, against the same nested network trained N + M epochs from scratch: test accuracy per
width (batch norms re-collected per width on 512 training images, torch eval). A user with
ImageNet weights follows the same path: ``trainer.nest(resnet18(weights=...))``, then train.

Both nested arms use one loop: SGD, a sampled pass (Downhill masks, weight noise) plus the
narrowest width's pass each step (the sandwich rule's two ends), cross-entropy only (no KL: a
benchmark of where the weights start, not of the Bayesian regime). Not in CI.

    .venv/bin/python benchmarks/nest_trained.py --epochs 2 --finetune 1 --images 5000
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


def train(model, x, y, epochs: int, lr: float, nested: bool, batch: int = 128) -> None:
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2, help="N: plain training epochs")
    p.add_argument("--finetune", type=int, default=1, help="M: epochs after nesting")
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--cifar-stem", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, y, xt, yt = load(args.images, args.test)
    calib = [(x[i:i + 128], y[i:i + 128]) for i in range(0, 512, 128)]
    t0 = time.time()
    plain = plain_resnet18(args.cifar_stem)
    train(plain, x, y, args.epochs, args.lr, nested=False)
    plain.eval()
    with torch.no_grad():
        plain_acc = float((plain(xt).argmax(1) == yt).float().mean())
    nested = nest(plain)
    with torch.no_grad():
        nested.eval()
        with nested.width(1.0):
            same = float((nested(xt[:64]) - plain(xt[:64])).abs().max()
                         / plain(xt[:64]).abs().max())
    before = accuracy(nested, xt, yt, calib)
    train(nested, x, y, args.finetune, args.lr / 2, nested=True)
    after = accuracy(nested, xt, yt, calib)
    t1 = time.time()
    torch.manual_seed(0)
    scratch = nest(plain_resnet18(args.cifar_stem))
    train(scratch, x, y, args.epochs + args.finetune, args.lr, nested=True)
    fresh = accuracy(scratch, xt, yt, calib)
    t2 = time.time()
    n, m = args.epochs, args.finetune
    print(f"resnet18 ({'CIFAR' if args.cifar_stem else 'ImageNet'} stem), cifar10_dev "
          f"{args.images} training / {args.test} test images; plain after {n} epochs: "
          f"{plain_acc:.4f}; nested at width 1.0 vs the trained network: {same:.1e} relative")
    print("| arm | " + " | ".join(f"acc {w:g}" for w in WIDTHS) + " | s |")
    print("|---" * (len(WIDTHS) + 2) + "|")
    print(f"| trained {n} + nested, no fine-tune | "
          + " | ".join(f"{before[w]:.4f}" for w in WIDTHS) + " | - |")
    print(f"| trained {n} + nested + {m} fine-tune | "
          + " | ".join(f"{after[w]:.4f}" for w in WIDTHS) + f" | {t1 - t0:.0f} |")
    print(f"| nested from scratch, {n + m} epochs | "
          + " | ".join(f"{fresh[w]:.4f}" for w in WIDTHS) + f" | {t2 - t1:.0f} |")


if __name__ == "__main__":
    main()
