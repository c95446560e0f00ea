"""One ``.pt`` file per trained (or quantized) network, loadable without executing code.

Everything inside is a dict of plain Python values and tensors, so
``torch.load(path, weights_only=True)`` reads it. Writes are atomic (temp file + rename): an
interrupted save never leaves a truncated checkpoint behind.
"""
from __future__ import annotations

import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from edge_sdk.bundle import InputSpec
from edge_sdk.errors import CheckpointError, InputSpecError
from trainer.models import NestedModel, create_model
from trainer.ordering import rescale_of

FORMAT = "edge-sdk-checkpoint"
VERSION = 1


def build_checkpoint(model: NestedModel, *, input_spec: dict, config: dict, split_seed: int,
                     metrics: dict | None = None, posterior: dict | None = None,
                     train_state: dict | None = None) -> dict[str, Any]:
    """Assemble the checkpoint dict. ``posterior`` describes the weight posterior's form
    (``{"kind": "gaussian"}`` after training; quantizers record their codebooks there)."""
    units = {id(u) for u in model.orderings()}
    orderings = {}
    for name, module in model.named_modules():
        if id(module) in units:
            orderings[name] = {"groups": module.groups, "frozen": module.frozen,
                               "keep_probability": module.keep_probability().detach().tolist()}
    return {
        "format": FORMAT,
        "version": VERSION,
        "arch": {"name": model.arch["name"], "kwargs": dict(model.arch["kwargs"])},
        # the standard layout, whatever the training ran in (train.channels_last)
        "state_dict": {k: v.detach().cpu().clone(memory_format=torch.contiguous_format)
                       for k, v in model.state_dict().items()},
        "orderings": orderings,
        "input_spec": input_spec,
        "classes": list(input_spec.get("classes", [])),
        "split_seed": int(split_seed),
        "config": config,
        "metrics": metrics or {},
        "posterior": _cpu(posterior or {"kind": "gaussian"}),
        "train_state": _cpu(train_state),
    }


def input_spec(ckpt: dict[str, Any]) -> InputSpec:
    """The input spec the checkpoint carries: what training normalised with (the training
    split's statistics) and its class names. Quantize and export reload the data against it
    (``trainer.data.load_data(cfg, spec)``) rather than computing a new one."""
    try:
        spec = InputSpec.from_dict(ckpt.get("input_spec"), "input_spec")
    except InputSpecError as exc:
        raise CheckpointError(f"the checkpoint's input spec is not valid: {exc}") from None
    if spec.classes is None:
        raise CheckpointError("the checkpoint's input spec carries no class names "
                              "(input_spec.classes)")
    if list(spec.classes) != list(ckpt.get("classes", spec.classes)):
        raise CheckpointError(f"the checkpoint's input spec names the classes {list(spec.classes)} "
                              f"but its classes are {list(ckpt['classes'])}")
    return spec


def _cpu(obj: Any) -> Any:
    """CPU copies of every tensor in nested dicts / lists (a GPU run's optimizer state and
    posterior): the file never depends on the device it was written from."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj


def save_checkpoint(ckpt: dict[str, Any], path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True`` and check its format and version."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist (expected a .pt file written by "
                              "`edge-sdk train`)")
    try:
        with warnings.catch_warnings():  # torch's advice is for its own users, not ours
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types; name the file either way
        raise CheckpointError(f"{path} is not an edge-sdk checkpoint: {_unreadable(e)}; "
                              f"{_EXPECTED}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an edge-sdk checkpoint: it has no format "
                              f"{FORMAT!r} marker; {_EXPECTED}")
    if ckpt.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {ckpt.get('version')!r}; this "
                              f"edge-sdk reads version {VERSION}")
    return ckpt


_EXPECTED = "expected a .pt file written by `edge-sdk train` or `edge-sdk quantize`"


def _unreadable(exc: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in our words: torch's own message
    advises ``weights_only=False``, i.e. running code from the file, which we never do."""
    if isinstance(exc, EOFError):
        return "the file is empty or truncated"
    text = str(exc)
    code = re.search(r"GLOBAL ([\w.]+)", text)
    if code:  # e.g. a whole pickled nn.Module, or something that would run a command
        return (f"it refers to Python code ({code.group(1)}), which a checkpoint of tensors and "
                "plain values never does, so it was not loaded")
    return "it is not a torch file of tensors and plain values"


def model_from_checkpoint(ckpt: dict[str, Any]) -> NestedModel:
    """Rebuild the architecture from its registry spec and load the weights (strictly)."""
    arch = ckpt["arch"]
    model = create_model(arch["name"], **arch["kwargs"])
    try:
        model.load_state_dict(ckpt["state_dict"], strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint weights do not match architecture {arch['name']}: {e}") from e
    # the keep-probability rescale follows the regime the network was trained with
    model.set_rescale(rescale_of(ckpt.get("config")))
    model.eval()
    return model
