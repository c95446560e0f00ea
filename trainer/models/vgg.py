"""``nested_vgg``: VGG-style network for 32x32 RGB, batch norm after each conv (BN³ §5.1 used VGG11)."""
from __future__ import annotations

import torch
from torch import nn

from edge_sdk.errors import ConfigError
from trainer.layers import BayesNestedConv2d, BayesNestedLinear
from trainer.models import register_model
from trainer.models.base import NestedModel, round_channels
from trainer.ordering import DownhillOrdering

_CFGS = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"],
}


class NestedVGG(NestedModel):
    """As in BN³ App. 9.1 the first conv (basic feature extraction) and the classifier are
    Bayesian but not nested; every other conv and the hidden dense layer are nested.

    ``hidden=0`` drops the hidden dense layer: the classifier reads the last conv's features
    directly (at 32x32 the VGG plans end at 1x1, so this is global average pooling into the
    classifier -- the "GAP head" ablation (docs/ablations.md), at ~the same MACs)."""

    def __init__(self, plan: list, in_channels: int, input_size: int, hidden: int,
                 num_classes: int, groups: int, frozen: int, prior_pi: float, init_mubar: float,
                 log_alpha_init: float):
        super().__init__()
        layers: list[nn.Module] = []
        prev_unit, channels, size, first = None, in_channels, input_size, True
        for item in plan:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
                size //= 2
                continue
            u = None if first else DownhillOrdering(groups, frozen, prior_pi, init_mubar)
            layers.append(BayesNestedConv2d(channels, item, 3, ordering=u,
                                            log_alpha_init=log_alpha_init).follows(prev_unit))
            prev_unit, channels, first = u, item, False
        if size < 1:
            raise ConfigError(f"input_size {input_size} is too small for {len(plan)} VGG stages")
        self.features = nn.Sequential(*layers)
        if hidden:
            u = DownhillOrdering(groups, frozen, prior_pi, init_mubar)
            self.fc = BayesNestedLinear(channels * size * size, hidden, ordering=u,
                                        batch_norm=True, log_alpha_init=log_alpha_init
                                        ).follows(prev_unit, size * size)
            self.classifier = BayesNestedLinear(hidden, num_classes, activation=None,
                                                log_alpha_init=log_alpha_init).follows(u)
        else:
            self.fc = nn.Identity()
            self.classifier = BayesNestedLinear(channels * size * size, num_classes,
                                                activation=None, log_alpha_init=log_alpha_init
                                                ).follows(prev_unit, size * size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.fc(torch.flatten(self.features(x), 1)))


@register_model
def nested_vgg(num_classes: int = 10, in_channels: int = 3, input_size: int = 32,
               depth: str = "vgg11", width_mult: float = 1.0, hidden: int = 512, groups: int = 8,
               frozen: int = 1, prior_pi: float = 0.9, init_mubar: float = 3.0,
               log_alpha_init: float = -4.0) -> NestedVGG:
    if depth not in _CFGS:
        raise ConfigError(f"nested_vgg depth must be one of {sorted(_CFGS)}, got {depth!r}")
    if hidden < 0:
        raise ConfigError(f"nested_vgg hidden must be >= 0 (0 = no hidden dense layer), got {hidden}")
    plan = [x if x == "M" else round_channels(x * width_mult, groups) for x in _CFGS[depth]]
    hidden = round_channels(hidden * width_mult, groups) if hidden else 0
    return NestedVGG(plan, in_channels, input_size, hidden,
                     num_classes, groups, frozen, prior_pi, init_mubar, log_alpha_init)
