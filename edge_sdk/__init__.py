"""edge-sdk: the on-device runtime. Depends on numpy, pyyaml and psutil only (never torch).

The public API is what ``__all__`` names: :func:`load` a bundle into an :class:`EdgeModel`,
set a :class:`Budget`, read a :class:`Prediction`; every error the SDK raises on purpose
derives from :class:`EdgeSdkError` and is importable from here.

    import edge_sdk
    model = edge_sdk.load("runs/demo/bundle")
    p = model.predict(x, edge_sdk.Budget(latency_ms=2.0))

``load``, ``EdgeModel``, ``Prediction``, ``Budget`` and ``BackendError`` are imported on first
use, so ``import edge_sdk`` (the CLI, an ``except edge_sdk.InputError``) loads no interpreter.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge_sdk.errors import (
    AllocationError,
    BudgetError,
    BudgetNotMetError,
    BundleError,
    CheckpointError,
    ChecksumMismatchError,
    ConfigError,
    DataError,
    EdgeSdkError,
    InputError,
    InputSpecError,
    InputSpecMismatchError,
    OutputError,
    ProfileError,
    SignatureError,
    SignatureMismatchError,
    SigningKeyError,
    SigningUnavailableError,
    SliceError,
    UnlistedFileError,
    UnsignedBundleError,
    UntrustedKeyError,
)

if TYPE_CHECKING:  # the real types for type checkers; at run time they load lazily (below)
    from edge_sdk.backends import BackendError
    from edge_sdk.policy.budget import Budget
    from edge_sdk.answers.prediction import Prediction
    from edge_sdk.device.readers import Readers
    from edge_sdk.device.state import DeviceState
    from edge_sdk.policy.rules import OnBattery, UnderContention, UnderMemoryPressure, WhenHot
    from edge_sdk.runtime.loading import load
    from edge_sdk.runtime.model import EdgeModel

__version__ = "0.1.0"

__all__ = [
    # the API
    "load",
    "EdgeModel",
    "Budget",
    "Prediction",
    "__version__",
    # device rules (docs/runtime.md, Device rules)
    "OnBattery",
    "WhenHot",
    "UnderMemoryPressure",
    "UnderContention",
    "Readers",
    "DeviceState",
    # the errors: one family, EdgeSdkError
    "EdgeSdkError",
    "ConfigError",
    "DataError",
    "CheckpointError",
    "InputError",
    "InputSpecError",
    "InputSpecMismatchError",
    "BundleError",
    "SliceError",
    "AllocationError",
    "OutputError",
    "ChecksumMismatchError",
    "SignatureError",
    "UnsignedBundleError",
    "UntrustedKeyError",
    "SignatureMismatchError",
    "UnlistedFileError",
    "SigningKeyError",
    "SigningUnavailableError",
    "BudgetError",
    "BudgetNotMetError",
    "ProfileError",
    "BackendError",
]

# name -> the module that defines it, imported on first access
_LAZY = {
    "load": "edge_sdk.runtime.loading",
    "EdgeModel": "edge_sdk.runtime.model",
    "Prediction": "edge_sdk.answers.prediction",
    "Budget": "edge_sdk.policy.budget",
    "BackendError": "edge_sdk.backends",
    "OnBattery": "edge_sdk.policy.rules",
    "WhenHot": "edge_sdk.policy.rules",
    "UnderMemoryPressure": "edge_sdk.policy.rules",
    "UnderContention": "edge_sdk.policy.rules",
    "Readers": "edge_sdk.device.readers",
    "DeviceState": "edge_sdk.device.state",
}


def __getattr__(name: str) -> Any:
    # lazy: importing edge_sdk (e.g. for the CLI or the errors) must not load the interpreter
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edge_sdk' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later look-ups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
