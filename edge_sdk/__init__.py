"""edge-sdk: the on-device runtime. Depends on numpy, pyyaml and psutil only (never torch)."""
from edge_sdk.errors import (  # noqa: F401
    BudgetError,
    BundleError,
    CheckpointError,
    ConfigError,
    DataError,
    EdgeSdkError,
    InputError,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    # lazy: importing edge_sdk (e.g. for the CLI or the errors) must not load the interpreter
    if name in ("load", "EdgeModel", "Prediction"):
        from edge_sdk import runtime

        return getattr(runtime, name)
    if name == "Budget":
        from edge_sdk.policy import Budget

        return Budget
    raise AttributeError(f"module 'edge_sdk' has no attribute {name!r}")
