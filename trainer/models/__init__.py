"""A registry of nested architectures (timm style): ``create_model(name, **kwargs)``."""
from __future__ import annotations

import inspect
from typing import Callable

from edge_sdk.errors import ConfigError
from trainer.models.base import NestedModel, round_channels
from trainer.models.factory import create_from_factory, is_factory_path

_REGISTRY: dict[str, Callable[..., NestedModel]] = {}


def register_model(fn: Callable[..., NestedModel]) -> Callable[..., NestedModel]:
    if fn.__name__ in _REGISTRY:
        raise ConfigError(f"model {fn.__name__!r} is already registered")
    _REGISTRY[fn.__name__] = fn
    return fn


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def create_model(name: str, **kwargs) -> NestedModel:
    """Build a registered model, or ``module:factory``'s network nested by ``trainer.nest``
    (:mod:`trainer.models.factory`); the name and arguments are recorded in ``model.arch``.

    ``weights`` (``model.weights``): a plain state dict loaded before nesting
    (:mod:`trainer.models.pretrained`); not recorded: the checkpoint holds the result."""
    weights = kwargs.pop("weights", None)
    if is_factory_path(name):
        model = create_from_factory(name, kwargs, weights)
        model.arch = {"name": name, "kwargs": dict(kwargs)}
        return model
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}; registered models: {', '.join(list_models())}"
                          "; or a 'module:factory' path returning a plain nn.Module")
    fn = _REGISTRY[name]
    allowed = inspect.signature(fn).parameters
    if weights is not None:
        if "weights" not in allowed:
            raise ConfigError(f"model.weights: {name!r} is built nested, so there is no plain "
                              "network to load a state dict into; use a model built by nest() "
                              "(mobilenet_v2, resnet20_cifar, nested_allconv) or a "
                              "module:factory returning the plain network")
        model = fn(**kwargs, weights=weights)
        model.arch = {"name": name, "kwargs": dict(kwargs)}
        return model
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ConfigError(f"model {name!r} got unknown argument(s) {unknown}; "
                          f"allowed: {', '.join(allowed)}")
    model = fn(**kwargs)
    model.arch = {"name": name, "kwargs": dict(kwargs)}
    return model


# Importing the variant modules registers them.
from trainer.models import cnn, mobilenetv2, vgg, zoo  # noqa: E402,F401

__all__ = ["NestedModel", "create_model", "list_models", "register_model", "round_channels"]
