"""TFLite interpreter backends, tried in order: LiteRT (``ai-edge-litert``, the base dependency),
then ``tflite-runtime`` (the fallback extra for platforms without LiteRT wheels)."""
from __future__ import annotations

from typing import Any

from edge_sdk.errors import EdgeSdkError

_CANDIDATES = (("ai_edge_litert.interpreter", "litert"), ("tflite_runtime.interpreter", "tflite-runtime"))


def interpreter_class() -> tuple[Any, str]:
    """(Interpreter class, backend name) of the first backend that imports."""
    import importlib

    errors = []
    for module, name in _CANDIDATES:
        try:
            return importlib.import_module(module).Interpreter, name
        except ImportError as e:
            errors.append(f"{module}: {e}")
    raise EdgeSdkError("no TFLite interpreter is installed; install edge-sdk (ai-edge-litert) "
                       "or edge-sdk[tflite-runtime]. Tried: " + "; ".join(errors))
