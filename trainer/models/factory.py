"""``model.name: my_pkg.models:resnet20`` (issue 20, CLI and config): a user's factory returning a
plain ``nn.Module``, nested by :func:`trainer.nest` (trainer/nesting.py).

The factory is called with ``num_classes``, ``in_channels``, ``input_size`` and the config's
``model.kwargs`` as keyword arguments. The nesting options come from the config too:
``model.groups`` / ``model.frozen``, ``ordering.prior_pi`` / ``init_mubar``,
``bayes.log_alpha_init``, and ``model.kwargs.nest`` (``residual``, ``nest_stem``) -- that key
is not passed to the factory. A checkpoint records the path and the arguments (plain values),
so loading it imports the factory's module and calls it, and executes nothing from the file.
"""
from __future__ import annotations

import importlib
import inspect
import re

from edge_sdk.errors import ConfigError

# what trainer.train.build_model passes to every model; the factory gets only the first three
_DATA_KEYS = ("num_classes", "in_channels", "input_size")
_NEST_KEYS = ("groups", "frozen", "prior_pi", "init_mubar", "log_alpha_init")
_NEST_OPTIONS = ("residual", "nest_stem") + _NEST_KEYS
_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def is_factory_path(name: str) -> bool:
    return ":" in name


def load_factory(path: str):
    """Import ``module:attr`` and return the callable (ConfigError naming what is wrong)."""
    if not _PATH.match(path):
        raise ConfigError(f"model.name {path!r}: expected a registered name or 'module:factory' "
                          "(e.g. my_pkg.models:resnet20)")
    mod_name, attr = path.split(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"model.name {path!r}: cannot import {mod_name!r} ({e}); is it on "
                          "PYTHONPATH or installed?") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"model.name {path!r}: {mod_name} has no callable {attr!r}")
    return fn


def create_from_factory(path: str, kwargs: dict):
    from torch import nn

    from trainer.nesting import nest

    fn = load_factory(path)
    kw = dict(kwargs)
    width_mult = kw.pop("width_mult", 1.0)
    if width_mult != 1.0:
        raise ConfigError(f"model.width_mult={width_mult}: a factory model ({path}) is built as "
                          "its factory defines it; scale it with the factory's own arguments")
    nest_kw = {k: kw.pop(k) for k in _NEST_KEYS if k in kw}
    extra = kw.pop("nest", None) or {}
    if not isinstance(extra, dict) or set(extra) - set(_NEST_OPTIONS):
        raise ConfigError(f"model.kwargs.nest must be a mapping of {', '.join(_NEST_OPTIONS)}; "
                          f"got {extra!r}")
    nest_kw.update(extra)
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = sorted(k for k in kw if k not in params and not takes_any)
    if unknown:
        raise ConfigError(f"model.name {path!r}: the factory takes no argument(s) {unknown} "
                          f"(it takes {', '.join(params) or 'none'}; it is called with "
                          f"{', '.join(_DATA_KEYS)} and model.kwargs)")
    net = fn(**kw)
    if not isinstance(net, nn.Module):
        raise ConfigError(f"model.name {path!r}: the factory returned {type(net).__name__}, "
                          "expected a torch nn.Module")
    return nest(net, **nest_kw)
