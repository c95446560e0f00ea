"""Writes the layer-kind fixtures of tests/edge_sdk/test_layer_kinds.py (issue 35; run from the
repository root with the workstation install: ``.venv/bin/python tests/edge_sdk/data/make_layer_kinds.py``).

One tiny network per layer kind that ``trainer.nest`` brought in for torchvision's CNN families,
nested, given random orderings and batch-norm statistics (keep-probability rescale on, so the
folds are exercised), truncated to one width and exported on the float route:

  layer_kinds_<case>.tflite  the float slice (GATHER + SLICE + CONV_2D + CONCATENATION grouped
                             convs, one cut inside a conv group; HARD_SWISH; LOGISTIC and the
                             squeeze-excitation MUL; PADV2 / PAD pooling, ceil_mode; 1x3 / 3x1
                             kernels; RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR; pre-activation
                             batch norm; a Hardswish stream folded through its adds)
  layer_kinds.npz            per case: ``<case>_x`` (NHWC float32 inputs, batch 2) and
                             ``<case>_ref`` (the torch truncation's logits, in float64)

The device-side test runs each file on the installed backend (tflite-runtime 2.14 in CI's
tflite-runtime step, which has no torch) and compares with the reference.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch import nn
from torchvision.models import efficientnet as tv_eff
from torchvision.models import mobilenetv3 as tv_mnv3
from torchvision.ops.misc import Conv2dNormActivation

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from exporters.tflite import export_point_slice  # noqa: E402
from support import randomise  # noqa: E402
from trainer.nesting import nest  # noqa: E402

NORM = nn.BatchNorm2d


def _head(c: int) -> list:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10)]


def grouped():
    """ResNeXt's bottleneck (16 channels in 2 conv groups of 8, whole groups), then RegNet's
    block with 2 conv groups of 8: too coarse, its unit cuts inside a conv group (width 0.25
    keeps 4 of the first group's 8)."""
    tv, rg = torchvision.models.resnet, torchvision.models.regnet
    down = nn.Sequential(nn.Conv2d(8, 32, 1, bias=False), NORM(32))
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), NORM(8), nn.ReLU(),
                         tv.Bottleneck(8, 8, 1, down, groups=2, base_width=64),
                         rg.ResBottleneckBlock(32, 16, 2, NORM, nn.ReLU, 8, 1.0, None),
                         *_head(16))


def hardswish_se():
    """MobileNetV3: Hardswish, a hardsigmoid squeeze-excitation gate, a residual add."""
    cfg = tv_mnv3.InvertedResidualConfig
    return nn.Sequential(
        Conv2dNormActivation(3, 8, 3, 2, norm_layer=NORM, activation_layer=nn.Hardswish),
        tv_mnv3.InvertedResidual(cfg(8, 3, 16, 8, True, "HS", 1, 1, 1.0), NORM),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 16), nn.Hardswish(),
        nn.Linear(16, 10))


def silu_se():
    """EfficientNet: SiLU (x * LOGISTIC(x)) and a sigmoid squeeze-excitation gate."""
    return nn.Sequential(
        Conv2dNormActivation(3, 8, 3, 1, norm_layer=NORM, activation_layer=nn.SiLU),
        tv_eff.MBConv(tv_eff.MBConvConfig(4, 3, 1, 8, 8, 1), 0.0, NORM), *_head(8))


def pools():
    """ResNet's padded max pool (PADV2), ceil_mode max pools, a padded average pool (PAD)."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), NORM(8), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), nn.Conv2d(8, 8, 1), nn.ReLU(),
                         nn.MaxPool2d(3, 2, ceil_mode=True), nn.AvgPool2d(3, 1, 1),
                         nn.Conv2d(8, 8, 1), nn.ReLU(), *_head(8))


class NonSquare(nn.Module):
    """Inception: 1x3 and 3x1 kernels (non-square padding and stride), concatenated."""

    def __init__(self):
        super().__init__()
        b = torchvision.models.inception.BasicConv2d
        self.stem = b(3, 8, kernel_size=3, padding=1)
        self.a = b(8, 8, kernel_size=(1, 3), padding=(0, 1))
        self.b = b(8, 8, kernel_size=(3, 1), padding=(1, 0))
        self.c = b(8, 8, kernel_size=(3, 1), padding=(1, 0), stride=(2, 1))
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        y = self.stem(x)
        cat = torch.cat([self.a(y), self.b(y)], 1)
        return self.fc(torch.cat([cat.mean((2, 3)), self.c(y).mean((2, 3))], 1))


class Upsampling(nn.Module):
    """A U-Net-style classifier: nearest x2 and bilinear (both align_corners) upsampling."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), NORM(8), nn.ReLU())
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), NORM(8), nn.ReLU())
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        e = self.enc(x)
        d = self.down(e)
        y = self.dec(torch.cat([self.up(d), e], 1))
        z = nn.functional.interpolate(d, scale_factor=2, mode="bilinear")
        z = nn.functional.interpolate(z, scale_factor=(1, 2), mode="bilinear",
                                      align_corners=True)
        return self.fc(torch.cat([y.mean((2, 3)), z.mean((2, 3))], 1))


class PreActivation(nn.Module):
    """DenseNet: pre-activation batch norms over a growing concatenation of nested branches
    (each keeps its prefix: the norm keeps an index set), a nested transition."""

    def __init__(self):
        super().__init__()
        dn = torchvision.models.densenet
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), NORM(16), nn.ReLU(),
            dn._DenseBlock(2, 16, 1, 16, 0.0), dn._Transition(48, 16),
            dn._DenseBlock(1, 16, 1, 16, 0.0), NORM(32))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        y = nn.functional.relu(self.features(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, (1, 1)), 1))


def stage_stream():
    """MobileNetV3-Large's start under residual='stage': the Hardswish stem's stream nested,
    its rescale folded forwards through the add."""
    cfg = tv_mnv3.InvertedResidualConfig
    return nn.Sequential(
        Conv2dNormActivation(3, 8, 3, 2, norm_layer=NORM, activation_layer=nn.Hardswish),
        tv_mnv3.InvertedResidual(cfg(8, 3, 8, 8, False, "RE", 1, 1, 1.0), NORM), *_head(8))


# case -> (builder, input side, width, nest() arguments)
CASES = {
    "grouped": (grouped, 8, 0.25, {}),
    "hardswish_se": (hardswish_se, 8, 0.5, {}),
    "silu_se": (silu_se, 6, 0.5, {}),
    "pools": (pools, 9, 0.5, {}),
    "non_square": (NonSquare, 6, 0.5, {}),
    "upsampling": (Upsampling, 6, 0.5, {}),
    "pre_activation": (PreActivation, 6, 0.5, {}),
    "stage_stream": (stage_stream, 8, 0.5, {"residual": "stage", "nest_stem": True}),
}


def build(case: str):
    """(the float slice's bytes, x, the torch truncation's float64 logits)."""
    make, side, width, kw = CASES[case]
    torch.manual_seed(0)
    source = make().double().eval()
    randomise(source, 3)
    model = nest(source, **kw).double().eval()
    randomise(model, 4)
    model.set_rescale(True)
    small = model.truncate(width).eval()
    x = np.random.default_rng(1).standard_normal((2, side, side, 3)).astype(np.float32)
    with torch.no_grad():
        ref = small(torch.from_numpy(x).double().permute(0, 3, 1, 2)).numpy()
    buf, _ = export_point_slice(small.float(), (1, side, side, 3), weights="float")
    return buf, x, ref


def main() -> None:
    torch.set_num_threads(1)
    arrays = {}
    for case in CASES:
        buf, x, ref = build(case)
        (HERE / f"layer_kinds_{case}.tflite").write_bytes(buf)
        arrays[f"{case}_x"], arrays[f"{case}_ref"] = x, ref
        print(f"layer_kinds_{case}.tflite: {len(buf)} bytes")
    np.savez(HERE / "layer_kinds.npz", **arrays)


if __name__ == "__main__":
    main()
