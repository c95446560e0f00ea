"""``nested_cnn_small``: a small CNN for 8x8 (digits) and 28x28 (MNIST-like) grey inputs."""
from __future__ import annotations

import torch
from torch import nn

from edge_sdk.errors import ConfigError
from trainer.layers import BayesNestedConv2d, BayesNestedLinear
from trainer.models import register_model
from trainer.models.base import NestedModel, round_channels
from trainer.ordering import DownhillOrdering


class NestedCNN(NestedModel):
    """conv blocks (each nested, max-pool after some) -> flatten -> nested fc -> Bayesian
    classifier. Flattening keeps spatial information, which 8x8 digits need; the classifier
    input columns are (C, H, W)-ordered, recorded as ``input_spatial`` for truncation/export."""

    def __init__(self, plan: list, in_channels: int, input_size: int, hidden: int,
                 num_classes: int, groups: int, frozen: int, prior_pi: float, init_mubar: float,
                 log_alpha_init: float):
        super().__init__()
        unit = lambda: DownhillOrdering(groups, frozen, prior_pi, init_mubar)  # noqa: E731
        features: list[nn.Module] = []
        prev_unit, channels, size = None, in_channels, input_size
        for item in plan:
            if item == "M":
                features.append(nn.MaxPool2d(2))
                size //= 2
                continue
            u = unit()
            conv = BayesNestedConv2d(channels, item, 3, ordering=u, log_alpha_init=log_alpha_init)
            features.append(conv.follows(prev_unit))
            prev_unit, channels = u, item
        self.features = nn.Sequential(*features)
        u = unit()
        self.fc = BayesNestedLinear(channels * size * size, hidden, ordering=u, batch_norm=True,
                                    log_alpha_init=log_alpha_init).follows(prev_unit, size * size)
        self.classifier = BayesNestedLinear(hidden, num_classes, activation=None,
                                            log_alpha_init=log_alpha_init).follows(u)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.fc(torch.flatten(self.features(x), 1)))


@register_model
def nested_cnn_small(num_classes: int = 10, in_channels: int = 1, input_size: int = 8,
                     width_mult: float = 1.0, groups: int = 8, frozen: int = 1,
                     prior_pi: float = 0.9, init_mubar: float = 3.0,
                     log_alpha_init: float = -4.0) -> NestedCNN:
    """8x8: conv32-conv64-pool (4x4) -> fc128; 28x28: conv32-pool-conv64-pool-conv64-pool (3x3) -> fc128."""
    c = lambda n: round_channels(n * width_mult, groups)  # noqa: E731
    if input_size < 8:
        raise ConfigError(f"nested_cnn_small needs input_size >= 8, got {input_size}")
    if input_size < 16:
        plan = [c(32), c(64), "M"]
    else:
        plan = [c(32), "M", c(64), "M", c(64), "M"]
    return NestedCNN(plan, in_channels, input_size, c(128), num_classes, groups, frozen,
                     prior_pi, init_mubar, log_alpha_init)
