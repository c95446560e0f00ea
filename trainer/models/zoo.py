"""Registered ``nest(...)`` of plain definitions ("Registry"): three-line variants,
like timm's. ``residual`` / ``nest_stem`` are :func:`trainer.nest`'s options (trainer/nesting.py;
BN³ App. 9.1: nesting inside the blocks, ``residual="inner"``, is what the paper does for
ResNeXt and MobileNetV2)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.models import register_model
from trainer.models.plain import AllConvNet, MobileNetV2, ResNet20Cifar, allconv_channels

if TYPE_CHECKING:  # trainer.nest_model imports trainer.models.base: a runtime import is a cycle
    from trainer.nest_model import NestedGraphModel


def _nest(net, groups, frozen, prior_pi, init_mubar, log_alpha_init, residual, nest_stem,
          weights=None):
    from trainer.nesting import nest

    if weights is not None:  # model.weights: the plain network's state dict, before nesting
        from trainer.models.pretrained import load_plain_weights

        load_plain_weights(net, weights, log=print)

    return nest(net, groups=groups, frozen=frozen, residual=residual, nest_stem=nest_stem,
                prior_pi=prior_pi, init_mubar=init_mubar, log_alpha_init=log_alpha_init)


@register_model
def resnet20_cifar(num_classes: int = 10, in_channels: int = 3, input_size: int = 32,
                   width_mult: float = 1.0, groups: int = 8, frozen: int = 1,
                   prior_pi: float = 0.9, init_mubar: float = 3.0, log_alpha_init: float = -4.0,
                   residual: str = "inner", nest_stem: bool = False,
                   weights: str | None = None) -> NestedGraphModel:
    """He et al.'s CIFAR ResNet-20 with 1x1 projection shortcuts; ``input_size`` is free
    (global pooling)."""
    net = ResNet20Cifar(num_classes, in_channels, width=4 * max(1, round(4 * width_mult)))
    return _nest(net, groups, frozen, prior_pi, init_mubar, log_alpha_init, residual, nest_stem,
                 weights)


@register_model
def mobilenet_v2(num_classes: int = 10, in_channels: int = 3, input_size: int = 32,
                 width_mult: float = 1.0, groups: int = 8, frozen: int = 1,
                 prior_pi: float = 0.9, init_mubar: float = 3.0, log_alpha_init: float = -4.0,
                 residual: str = "inner", nest_stem: bool = False,
                 weights: str | None = None) -> NestedGraphModel:
    """torchvision's MobileNetV2 (ReLU6 kept: its rescale folds forward), CIFAR strides for
    inputs up to 64x64."""
    net = MobileNetV2(num_classes, in_channels, width_mult, cifar=input_size <= 64)
    return _nest(net, groups, frozen, prior_pi, init_mubar, log_alpha_init, residual, nest_stem,
                 weights)


@register_model
def nested_allconv(num_classes: int = 10, in_channels: int = 3, input_size: int = 32,
                   width_mult: float = 1.0, groups: int = 8, frozen: int = 1,
                   prior_pi: float = 0.9, init_mubar: float = 3.0, log_alpha_init: float = -4.0,
                   nest_stem: bool = True, weights: str | None = None) -> NestedGraphModel:
    """The all-convolutional reference network (:class:`AllConvNet`: 32, 32 | 64, 64 |
    128, 128 channels, max-pool per stage, global average pooling), nested. ``nest_stem``
    nests the first conv too, so a width-w slice has exactly the channels -- and the MACs -- of
    the plain network at width w (BN³ App. 9.1 keeps the stem whole; here that would leave
    width 0.25 at 5.0 M MACs instead of 2.6 M). ``input_size`` is free (global pooling)."""
    del input_size
    net = AllConvNet(num_classes, in_channels,
                     allconv_channels(width_mult, 4 * groups))
    return _nest(net, groups, frozen, prior_pi, init_mubar, log_alpha_init, "inner", nest_stem,
                 weights)
