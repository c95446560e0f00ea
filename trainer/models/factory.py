"""``model.name: my_pkg.models:resnet20`` (CLI and config): a user's factory returning a
plain ``nn.Module``, nested by :func:`trainer.nest` (trainer/nesting.py).

The factory is called with the config's ``model.kwargs`` and those of ``num_classes``,
``in_channels``, ``input_size`` its signature names (``torchvision.models:resnet18``
takes ``**kwargs`` it forwards to its class, so a factory with ``**kwargs`` gets only
``num_classes``, the one argument every torchvision classifier takes). A factory that takes no
``in_channels`` gets its stem -- the ``Conv2d`` reading the input -- replaced by one with
``in_channels`` inputs (same kernel, stride, padding; freshly initialised) when the data is not
3-channel. A factory whose network fails on a ``[1, in_channels, input_size, input_size]``
input is a ConfigError at build time, before any training. The nesting options come from the config too:
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


def create_from_factory(path: str, kwargs: dict, weights: str | None = None):
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
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no signature to match
        params = {}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    data = {k: kw.pop(k) for k in _DATA_KEYS if k in kw}
    # the data's shape goes where the signature names it; **kwargs gets num_classes alone
    call = {k: v for k, v in data.items()
            if k in params or (takes_any and k == "num_classes")}
    unknown = sorted(k for k in kw if k not in params and not takes_any)
    if unknown:
        raise ConfigError(f"model.name {path!r}: the factory takes no argument(s) {unknown} "
                          f"(it takes {', '.join(params) or 'none'}; it is called with "
                          f"model.kwargs and those of {', '.join(_DATA_KEYS)} it names)")
    try:
        net = fn(**kw, **call)
    except TypeError as e:  # an argument the factory's own class does not take
        raise ConfigError(f"model.name {path!r}: calling it with {sorted({**kw, **call})} "
                          f"failed: {e}") from None
    if not isinstance(net, nn.Module):
        raise ConfigError(f"model.name {path!r}: the factory returned {type(net).__name__}, "
                          "expected a torch nn.Module")
    channels = data.get("in_channels", 3)
    if "in_channels" not in call and channels != 3:
        _replace_stem(net, channels, path)
    if "input_size" in data:
        _check_forward(net, channels, data["input_size"], path)
    if weights is not None:  # model.weights: into the plain network, before nesting
        from trainer.models.pretrained import load_plain_weights

        load_plain_weights(net, weights, log=print)
    return nest(net, **nest_kw)


def _replace_stem(net, channels: int, path: str) -> None:
    """The Conv2d reading the input, rebuilt with ``channels`` inputs (kernel, stride,
    padding, groups 1 and bias kept; weights freshly initialised: they were 3-channel)."""
    from torch import fx, nn

    try:
        gm = fx.symbolic_trace(net)
    except Exception as e:
        raise ConfigError(f"model.name {path!r}: in_channels={channels}, and torch.fx cannot "
                          f"trace the network to find its stem ({e})") from None
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    users = list(x.users)
    stem = users[0] if len(users) == 1 else None
    conv = None if stem is None or stem.op != "call_module" else gm.get_submodule(stem.target)
    if not isinstance(conv, nn.Conv2d) or conv.groups != 1:
        raise ConfigError(f"model.name {path!r}: in_channels={channels}, but the factory takes "
                          "no in_channels and its input is not read by one plain Conv2d (a "
                          "stem to rebuild); use a factory with an in_channels argument")
    new = nn.Conv2d(channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                    conv.dilation, 1, conv.bias is not None, conv.padding_mode)
    net.set_submodule(stem.target, new)


def _check_forward(net, channels: int, size: int, path: str) -> None:
    import torch

    was = net.training
    net.eval()
    try:
        with torch.no_grad():
            net(torch.zeros(1, channels, size, size))
    except Exception as e:  # too small an input for its downsampling, say
        raise ConfigError(f"model.name {path!r}: the network fails on a [1, {channels}, {size}, "
                          f"{size}] input (data.image_size / the data set's): "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    finally:
        net.train(was)
