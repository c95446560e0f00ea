"""Plain (not nested, not Bayesian) definitions that :func:`trainer.nest` (trainer/nesting.py) converts: the
registry's ``resnet20_cifar`` is ``nest(...)`` of these (issue 20).

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
        self.option_a = shortcut == "A" and (stride != 1 or cin != cout)
        self.shortcut = nn.Sequential()
        if (stride != 1 or cin != cout) and not self.option_a:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.option_a:
            sc = F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad), "constant", 0.0)
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

