"""Deterministic baselines for ``benchmarks/baselines.py``: a config's model graph from stock
layers at a fixed width, a US-Nets style slimmable version of it, and their training loops (same
optimizer, lr schedule, batch size, shuffling and epochs as ``trainer.train``)."""
from __future__ import annotations

import copy
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from train_speed import deterministic_twin  # benchmarks/ is on sys.path when run as a script
from trainer.config import Config
from trainer.models import create_model
from trainer.models.plain import AllConvNet, allconv_channels
from trainer.device import as_channels_last, channels_last_
from trainer.train import _loader, _optimizer, _scheduler

GROUPS = 8  # the nested model's ordering groups: widths come in steps of 1/8, as ours do


def plain_net(cfg: Config, width: float, num_classes: int, in_channels: int,
              input_size: int) -> nn.Module:
    """The config's model graph at ``width`` from stock Conv2d/Linear/BN/ReLU.

    Below full width, groups=1 makes ``round_channels`` round to multiples of 4 only, so width_mult x width gives
    the channel counts of our width-w slice (whose stem, where it is not nested, stays full)."""
    # At full width the groups' rounding (multiples of 4 x groups) is ours too: without it the
    # baselines had 9.9 M MACs where ours has 11.5 M (cifar10_dev, width_mult 0.25).
    groups = cfg.model.groups if width == 1.0 else 1
    if cfg.model.name == "nested_allconv":  # issue 32's reference, from its stock definition
        return AllConvNet(num_classes, in_channels,
                          allconv_channels(cfg.model.width_mult * width, 4 * groups))
    nested = create_model(cfg.model.name, num_classes=num_classes, in_channels=in_channels,
                          input_size=input_size, width_mult=cfg.model.width_mult * width,
                          groups=groups, frozen=groups, **cfg.model.kwargs)
    return deterministic_twin(nested)


@torch.no_grad()
def count_macs(model: nn.Module, x: torch.Tensor) -> int:
    """Multiply-accumulates of one input through every conv / linear layer (forward hooks)."""
    total = [0]

    def hook(layer, _inp, out):
        total[0] += out[0].numel() * layer.weight[0].numel()

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Conv2d, nn.Linear))]
    was = model.training
    model.eval()
    try:
        model(x[:1])
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    return total[0]


def fp32_bytes(model: nn.Module) -> int:
    return 4 * sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------ slimmable
def keep(n: int, width: float) -> int:
    """Channels kept of ``n`` at ``width``: whole groups of n / 8, rounded up, at least one."""
    step = n // GROUPS
    return min(n, max(step, math.ceil(round(width * GROUPS, 6)) * step))


class SlimConv2d(nn.Conv2d):
    width = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = keep(self.out_channels, self.width)
        bias = None if self.bias is None else self.bias[:out]
        return F.conv2d(x, self.weight[:out, : x.shape[1]], bias, self.stride, self.padding)


class SlimLinear(nn.Linear):
    """Input columns follow the (C, H, W) flatten, so the first k channels are the first k*H*W."""
    width = 1.0
    slim_out = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = keep(self.out_features, self.width) if self.slim_out else self.out_features
        bias = None if self.bias is None else self.bias[:out]
        return F.linear(x, self.weight[:out, : x.shape[1]], bias)


class SlimBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Shared affine parameters, sliced running statistics (re-collected per width afterwards)."""
    width = 1.0

    def _check_input_dim(self, x: torch.Tensor) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[1]
        factor = 0.0
        if self.training:
            self.num_batches_tracked += 1
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        return F.batch_norm(x, self.running_mean[:k], self.running_var[:k], self.weight[:k],
                            self.bias[:k], self.training, factor, self.eps)


def slimmable_net(model: nn.Module) -> nn.Module:
    """``model`` (a full-width plain graph) with every conv / linear / BN switchable by width."""

    def swap(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if isinstance(child, nn.Conv2d):
                new = SlimConv2d(child.in_channels, child.out_channels, child.kernel_size,
                                 child.stride, child.padding, bias=child.bias is not None)
            elif isinstance(child, nn.Linear):
                new = SlimLinear(child.in_features, child.out_features, bias=child.bias is not None)
            elif isinstance(child, (nn.BatchNorm1d, nn.BatchNorm2d)):
                new = SlimBatchNorm(child.num_features, child.eps, child.momentum)
            else:
                swap(child)
                continue
            new.load_state_dict(child.state_dict())
            setattr(parent, name, new)

    swap(model)
    linears = [m for m in model.modules() if isinstance(m, SlimLinear)]
    linears[-1].slim_out = False  # the classifier always has every class
    return model


def set_width(model: nn.Module, width: float) -> None:
    for m in model.modules():
        if isinstance(m, (SlimConv2d, SlimLinear, SlimBatchNorm)):
            m.width = width


@torch.no_grad()
def recollect_bn(model: nn.Module, calib: list) -> None:
    """US-Nets BN calibration: cumulative statistics over ``calib`` at the current width."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    model.eval()
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    for x, *_ in calib:
        model(x)
    model.eval()


# ------------------------------------------------------------------------------ training
def _epochs(model: nn.Module, cfg: Config, train_ds, seed: int, epochs: int, step_fn) -> float:
    """Our trainer's recipe: optimizer, per-step schedule, batch size, per-epoch reseeded
    shuffling, drop_last. Returns wall seconds."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    # the memory layout ours trains in (train.channels_last), on weights and inputs: NHWC
    # weights are the baselines' faster choice (US-Nets step 406 -> 345 ms), so goal 4 compares
    # methods, not layouts
    channels_last_(model, cfg.train.channels_last)
    opt = _optimizer(model, cfg)
    loader = _loader(train_ds, cfg.train.batch_size, True, seed,
                     workers=cfg.train.num_workers)  # a photo folder decodes in workers
    sched = _scheduler(opt, cfg, len(loader) * epochs, len(loader))
    for epoch in range(epochs):
        loader.generator.manual_seed(seed * 100_003 + epoch)
        model.train()
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            step_fn(as_channels_last(x, cfg.train.channels_last), y)
            if cfg.train.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            opt.step()
            sched.step()
    return time.perf_counter() - t0


def train_plain(model: nn.Module, cfg: Config, train_ds, seed: int, epochs: int) -> float:
    def step(x, y):
        F.cross_entropy(model(x), y).backward()
    return _epochs(model, cfg, train_ds, seed, epochs, step)


def train_slimmable(model: nn.Module, cfg: Config, train_ds, seed: int, epochs: int,
                    min_width: float = 0.25, n_random: int = 2) -> float:
    """Sandwich rule (max + min + n random widths per step, gradients summed, one update) with
    in-place distillation (smaller widths fit the max width's detached soft targets)."""
    gen = torch.Generator().manual_seed(seed + 1)

    def step(x, y):
        set_width(model, 1.0)
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        soft = torch.softmax(logits.detach(), -1)
        rand = min_width + (1.0 - min_width) * torch.rand(n_random, generator=gen)
        for w in [min_width, *rand.tolist()]:
            set_width(model, w)
            (-(soft * torch.log_softmax(model(x), -1)).sum(1).mean()).backward()
        set_width(model, 1.0)
    return _epochs(model, cfg, train_ds, seed, epochs, step)


@torch.no_grad()
def logits_of(model: nn.Module, batches: list) -> np.ndarray:
    model.eval()
    return torch.cat([model(x) for x, *_ in batches]).double().numpy()


def slim_at(model: nn.Module, width: float, calib: list) -> nn.Module:
    """A copy of the slimmable network switched to ``width`` with its BN re-calibrated."""
    m = copy.deepcopy(model)
    set_width(m, width)
    recollect_bn(m, calib)
    return m
