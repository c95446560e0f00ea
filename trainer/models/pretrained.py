"""``model.weights: <path>``: a plain network's state dict loaded before nesting (a pretrained
start: nesting a trained network measured well ahead of nesting from scratch at equal epochs,
docs/own-networks.md), its classifier resized to the data's classes.

Read with ``torch.load(weights_only=True)`` (no code runs from the file). The file may hold the
state dict itself (torchvision's downloads, ``torch.save(net.state_dict())``) or a dict with
it under ``state_dict`` or ``model``. Every key must match the network by name and shape,
except the classifier's (the last ``Linear``), which stays freshly initialised when its shape
differs: ImageNet's 1,000 classes -> the data's. Anything else that differs is a ConfigError
naming the keys and both shapes.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from edge_sdk.errors import ConfigError

_SHOWN = 6  # keys listed per kind of mismatch in an error


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    p = os.path.expanduser(path)
    if not os.path.isfile(p):
        raise ConfigError(f"model.weights: '{path}' not found (cwd: {os.getcwd()}); expected a "
                          "state dict saved with torch.save")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle errors, a non-torch file, a truncated download
        raise ConfigError(f"model.weights: cannot read '{path}' as a torch state dict "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConfigError(f"model.weights: '{path}' holds {type(obj).__name__}, not a state dict "
                          "(a mapping of parameter names to tensors)")
    return obj


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def load_plain_weights(net: nn.Module, path: str, log=None) -> None:
    """Load ``path`` into the plain network ``net`` (before :func:`trainer.nest`)."""
    given = read_state_dict(path)
    own = net.state_dict()
    linears = [name for name, m in net.named_modules() if isinstance(m, nn.Linear)]
    head = linears[-1] if linears else None
    head_keys = {f"{head}.weight", f"{head}.bias"} if head else set()
    missing = sorted(set(own) - set(given))
    unexpected = sorted(set(given) - set(own))
    shapes = sorted(k for k in set(own) & set(given) if own[k].shape != given[k].shape)
    resized = [k for k in shapes if k in head_keys]
    shapes = [k for k in shapes if k not in head_keys]
    problems = []
    if missing:
        problems.append(f"missing from the file: {_listed(missing)}")
    if unexpected:
        problems.append(f"not in the model: {_listed(unexpected)}")
    if shapes:
        problems.append("shapes differ (model vs file): " + _listed(
            [f"{k} {tuple(own[k].shape)} vs {tuple(given[k].shape)}" for k in shapes]))
    if problems:
        raise ConfigError(f"model.weights '{path}' does not fit the model ({len(own)} keys): "
                          + "; ".join(problems) + " (is model.name / width_mult the network "
                          "these weights were trained as?)")
    keep = {k: v for k, v in given.items() if k not in resized}
    net.load_state_dict({**own, **keep})
    if log is not None:
        log(f"model.weights: loaded {len(keep)} tensors from {path}" + (
            f"; the classifier {head} was resized to {tuple(own[f'{head}.weight'].shape)} "
            "(freshly initialised)" if resized else ""))
