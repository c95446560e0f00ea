"""``nested_mobilenetv2``: MobileNetV2 for 32x32 inputs with nesting on the expanded channels.

As in BN³ App. 9.1 the ordering unit sits on each inverted residual block's expanded
(depthwise) channels; the block's input and output channels stay fixed, so residual additions
never see a truncated tensor. Nested blocks use ReLU (positive-homogeneous, so the keep
probability folds into batch norm at export); the stem and the last 1x1 conv keep ReLU6.
"""
from __future__ import annotations

import torch
from torch import nn

from trainer.layers import BayesNestedConv2d, BayesNestedLinear
from trainer.models import register_model
from trainer.models.base import NestedModel, round_channels
from trainer.ordering import DownhillOrdering

# (expansion t, output channels c, repeats n, first stride s); CIFAR variant: stride 1 at the
# stem and in the second stage, so 32x32 inputs end at 4x4.
_SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
             (6, 160, 3, 2), (6, 320, 1, 1)]


def _make_divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int, groups: int, frozen: int,
                 prior_pi: float, init_mubar: float, log_alpha_init: float):
        super().__init__()
        kw = dict(log_alpha_init=log_alpha_init)
        self.residual = stride == 1 and cin == cout
        if expand == 1:
            # No expansion: the depthwise channels are the block's input channels, which stay
            # fixed, so this block is not nested.
            self.expand = None
            self.dw = BayesNestedConv2d(cin, cin, 3, stride, depthwise=True, activation="relu6", **kw)
            self.project = BayesNestedConv2d(cin, cout, 1, activation=None, **kw)
            return
        # Rounded up so each of the G groups has a multiple of 4 channels (XNNPACK-friendly).
        hidden = round_channels(cin * expand, groups)
        self.unit = DownhillOrdering(groups, frozen, prior_pi, init_mubar)
        # The expand conv's channel c only feeds depthwise channel c: mask once, after the
        # depthwise block; the expand conv shares the unit for its KL weights and truncation.
        self.expand = BayesNestedConv2d(cin, hidden, 1, ordering=self.unit, apply_mask=False, **kw)
        self.dw = BayesNestedConv2d(hidden, hidden, 3, stride, depthwise=True, ordering=self.unit,
                                    **kw).follows(self.unit)
        self.project = BayesNestedConv2d(hidden, cout, 1, activation=None, **kw).follows(self.unit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x if self.expand is None else self.expand(x)
        y = self.project(self.dw(y))
        return x + y if self.residual else y


class NestedMobileNetV2(NestedModel):
    def __init__(self, num_classes: int, in_channels: int, width_mult: float, groups: int,
                 frozen: int, prior_pi: float, init_mubar: float, log_alpha_init: float):
        super().__init__()
        kw = dict(log_alpha_init=log_alpha_init)
        cin = _make_divisible(32 * width_mult)
        self.stem = BayesNestedConv2d(in_channels, cin, 3, 1, activation="relu6", **kw)
        blocks = []
        for t, c, n, s in _SETTINGS:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                blocks.append(InvertedResidual(cin, cout, s if i == 0 else 1, t, groups, frozen,
                                               prior_pi, init_mubar, log_alpha_init))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        last = _make_divisible(1280 * max(1.0, width_mult))
        self.head = BayesNestedConv2d(cin, last, 1, activation="relu6", **kw)
        self.classifier = BayesNestedLinear(last, num_classes, activation=None, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(self.blocks(self.stem(x)))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


@register_model
def nested_mobilenetv2(num_classes: int = 10, in_channels: int = 3, input_size: int = 32,
                       width_mult: float = 1.0, groups: int = 8, frozen: int = 1,
                       prior_pi: float = 0.9, init_mubar: float = 3.0,
                       log_alpha_init: float = -4.0) -> NestedMobileNetV2:
    """``input_size`` is accepted for a uniform interface; global pooling makes it free."""
    del input_size
    return NestedMobileNetV2(num_classes, in_channels, width_mult, groups, frozen, prior_pi,
                             init_mubar, log_alpha_init)
