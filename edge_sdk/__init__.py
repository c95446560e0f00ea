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
