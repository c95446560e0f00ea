"""The manifest's ``activation_quant`` (schema version 7, layout store): per width, the scale
and zero point of every int8 activation of the width's integer slice, which the device's
materialiser builds it with (:func:`edge_sdk.tflite.integer.integer_graph`).
"""
from __future__ import annotations

from edge_sdk.bundle.records import _width_key
from edge_sdk.validation import f32_value, fail, int_value, key_path, list_value, mapping, show, \
    str_value

__all__ = ["parse_activation_quant"]


def parse_activation_quant(value: object, path: str, version: int
                           ) -> dict[str, dict[str, tuple[float, int]]]:
    """Width key -> tensor name -> (scale, zero point): finite float32 scales > 0, zero points
    in [-128, 127] (what an int8 tensor's quantization holds)."""
    given = mapping(value, path)
    if given and version < 7:
        fail(path, f"needs schema version 7 (a version-{version} bundle has no integer "
                   "slices); set schema_version: 7 or remove it")
    out: dict[str, dict[str, tuple[float, int]]] = {}
    for wk, per in given.items():
        wp = key_path(path, wk)
        _width_key(wk, wp)
        tensors: dict[str, tuple[float, int]] = {}
        for name, q in mapping(per, wp).items():
            tp = key_path(wp, name)
            str_value(name, tp)
            pair = list_value(q, tp)
            if len(pair) != 2:
                fail(tp, f"expected [scale, zero point], got {show(q)}")
            scale = f32_value(pair[0], f"{tp}[0]", positive=True)
            tensors[str(name)] = (scale, int_value(pair[1], f"{tp}[1]", minimum=-128,
                                                   maximum=127))
        out[str(wk)] = tensors
    return out
