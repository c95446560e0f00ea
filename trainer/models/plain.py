"""Plain (not nested, not Bayesian) definitions that :func:`trainer.nest` (trainer/nesting.py)
converts: the registry's ``resnet20_cifar`` and ``mobilenet_v2`` are ``nest(...)`` of these
("Registry").

``ResNet20Cifar`` is He et al.'s CIFAR ResNet-20 (3 stages of 3 basic blocks, 16/32/64 channels).
Its shortcut where the shape changes is a 1x1 projection + BN ("option B"): the original
"option A" zero-pads the new channels on *both* sides of the strided identity, which no prefix
truncation keeps aligned, so ``nest`` refuses it; ``shortcut="A"`` builds it (for that test).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, shortcut: str = "B"):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.pad = (cout - cin) // 2 if cout != cin else 0
        # "A": zero channels on both sides of the strided identity (the original); "A-end":
        # all of them after it (aligned under prefix truncation, for the tests)
        self.option_a = shortcut in ("A", "A-end") and (stride != 1 or cin != cout)
        self.pad_at_end = shortcut == "A-end"
        self.shortcut = nn.Sequential()
        if (stride != 1 or cin != cout) and not self.option_a:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.option_a:
            before, after = (0, 2 * self.pad) if self.pad_at_end else (self.pad, self.pad)
            sc = F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, before, after), "constant", 0.0)
        else:
            sc = self.shortcut(x)
        return F.relu(out + sc)


class ResNet20Cifar(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 16,
                 blocks: int = 3, shortcut: str = "B"):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, cin = [], width
        for stage, stride in enumerate((1, 2, 2)):
            cout = width * 2 ** stage
            for i in range(blocks):
                layers.append(BasicBlock(cin, cout, stride if i == 0 else 1, shortcut))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


def resnet20_cifar_plain(num_classes: int = 10, in_channels: int = 3, input_size: int = 32,
                         shortcut: str = "B") -> ResNet20Cifar:
    """``input_size`` is accepted for the factory interface; global pooling makes it free."""
    del input_size
    return ResNet20Cifar(num_classes, in_channels, shortcut=shortcut)



def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding (the nearest multiple of 8, never 10 % below ``v``)."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _conv_bn_relu6(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """torchvision's block: [1x1 expand ReLU6] -> 3x3 depthwise ReLU6 -> 1x1 linear bottleneck."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = round(cin * expand)
        self.use_res_connect = stride == 1 and cin == cout
        layers = [] if expand == 1 else [_conv_bn_relu6(cin, hidden, 1)]
        layers += [_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's ``mobilenet_v2`` with the same module names (its ImageNet weights load with
    ``load_state_dict``) and, for small inputs (``input_size <= 64``), the usual CIFAR strides:
    stride 1 in the stem and the second stage, so 32x32 ends at 4x4 rather than 1x1."""

    _SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                 (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000, in_channels: int = 3, width_mult: float = 1.0,
                 cifar: bool = False, dropout: float = 0.2):
        super().__init__()
        cin = _make_divisible(32 * width_mult)
        last = _make_divisible(1280 * max(1.0, width_mult))
        features = [_conv_bn_relu6(in_channels, cin, 3, 1 if cifar else 2)]
        for i, (t, c, n, s) in enumerate(self._SETTINGS):
            cout = _make_divisible(c * width_mult)
            s = 1 if cifar and i == 1 else s
            for j in range(n):
                features.append(InvertedResidual(cin, cout, s if j == 0 else 1, t))
                cin = cout
        features.append(_conv_bn_relu6(cin, last, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class AllConvNet(nn.Module):
    """The all-convolutional CIFAR network measured as the reference: per stage two
    3x3 conv + BN + ReLU, a 2x2 max-pool after each stage, global average pooling, one linear
    layer. ``channels`` = (32, 64, 128) is 38.6 M MACs at 32x32 -- the compute of ``nested_vgg``
    at width_mult 0.5 -- with 0.29 M parameters (VGG's: 2.4 M): it spends its MACs at high
    resolution instead of on deep narrow maps and a hidden dense layer."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3,
                 channels: tuple[int, ...] = (32, 64, 128), convs_per_stage: int = 2):
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_channels
        for cout in channels:
            for _ in range(convs_per_stage):
                layers += [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
                           nn.ReLU(inplace=True)]
                cin = cout
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def allconv_channels(width_mult: float, multiple: int = 4) -> tuple[int, int, int]:
    """(32, 64, 128) x ``width_mult``, each rounded up to ``multiple`` (TFLite/XNNPACK's
    4-channel packing; the nested model's groups need multiples of 4 x groups)."""
    return tuple(max(multiple, int(-(-round(c * width_mult, 6) // multiple)) * multiple)
                 for c in (32, 64, 128))
