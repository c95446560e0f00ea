"""Where training runs: ``train.device`` (auto | cpu | cuda | mps) -> a ``torch.device``.

Training, the quantizers' fine-tuning and the exporter's BN re-collection run on it;
checkpoints are always written from CPU copies and read with ``map_location="cpu"``, so a model
trained on a GPU loads on a machine without one.
"""
from __future__ import annotations

import os

import torch

from edge_sdk.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda", "mps")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(name: str) -> torch.device:
    """``auto`` = CUDA when available, else the CPU. Under torchrun on CUDA each process takes
    the GPU of its ``LOCAL_RANK``. An unavailable device is a ConfigError, never a silent CPU run."""
    if name not in DEVICES:
        raise ConfigError(f"train.device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                "train.device is cuda, but torch.cuda.is_available() is False (torch "
                f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'}): use "
                "train.device=cpu or auto, or install a CUDA build of torch")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if name == "mps":
        if not _mps_available():
            raise ConfigError("train.device is mps, but torch.backends.mps.is_available() is "
                              "False (Apple silicon with a macOS build of torch only): use "
                              "train.device=cpu or auto")
        return torch.device("mps")
    return torch.device("cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (CPU for a model without any)."""
    p = next(model.parameters(), None)
    return torch.device("cpu") if p is None else p.device


def ddp_backend(device: torch.device) -> str:
    """nccl for CUDA processes, gloo otherwise (CPU; nccl has no CPU or MPS support)."""
    return "nccl" if device.type == "cuda" else "gloo"


def channels_last_(model: torch.nn.Module, enabled: bool = True) -> torch.nn.Module:
    """The model's 4-D (convolution) weights in NHWC (training without weight noise: ours when
    the recipe never samples it, and the baselines); other parameters untouched."""
    return model.to(memory_format=torch.channels_last) if enabled else model


def as_channels_last(x: torch.Tensor, enabled: bool = True) -> torch.Tensor:
    """A batch of images (N, C, H, W) in NHWC; anything else unchanged."""
    return x.contiguous(memory_format=torch.channels_last) if enabled and x.ndim == 4 else x
