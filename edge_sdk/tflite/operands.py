"""The writer's operand constants read back into the options they were made from, so that no
bundle crashes the process (docs/reliability.md): RESHAPE's shape, PAD / PADV2's paddings (and
PADV2's pad value), MEAN's axes, SLICE's begin and size, GATHER's indices, the resize ops' size
and ADD / MUL's scalar are each a constant input (int32, or float32 [1]) used by that one op
alone; anything else is a :class:`~edge_sdk.errors.SliceError`.

:mod:`edge_sdk.tflite.reader` parses the rest of a ``.tflite`` file and calls these for each
operator (:func:`~edge_sdk.tflite.reader.read_graph`).
"""
from __future__ import annotations

import math
from typing import Any, TYPE_CHECKING

from edge_sdk.tflite.ops import REDUCERS

if TYPE_CHECKING:
    from edge_sdk.tflite.tensors import TensorEntry, Weights
    from edge_sdk.tflite.flatbuffer import Flat

# ops whose second input is an int32 operand the writer makes from an option
OPERANDS = {"RESHAPE": "shape", "PAD": "paddings", "PADV2": "paddings",
            **{r: "axes" for r in REDUCERS},
            "SLICE": "begin", "GATHER": "indices", "RESIZE_NEAREST_NEIGHBOR": "size",
            "RESIZE_BILINEAR": "size"}


def operand(op: str, ins: list[str | None], options: dict[str, Any], weights: Weights,
            tensors: list[TensorEntry], operand_of: dict[str, str], flat: Flat, where: str
            ) -> list[str | None]:
    """RESHAPE / PAD / MEAN: input 1 is an int32 constant the writer made from an option;
    it becomes that option again (and must agree with ReshapeOptions.new_shape)."""
    # PADV2 has a third input, its pad value; SLICE's third is its size
    arity = 3 if op in ("PADV2", "SLICE") else 2
    name = ins[1] if len(ins) == arity else None
    if name is None or name not in weights:
        raise flat.bad(f"{where}: expected [input, int32 constant operand"
                       f"{', pad value' if arity == 3 else ''}], got {ins}")
    t = next(t for t, _ in tensors if t.name == name)
    if t.dtype != "int32" or name in operand_of or t.quant is not None:
        raise flat.bad(f"{where}: operand {name!r} must be an int32 constant used once")
    operand_of[name] = where
    value = weights[name]
    key = OPERANDS[op]
    if op == "RESHAPE":
        if value.ndim != 1 or (options["shape"] is not None
                               and options["shape"] != value.tolist()):
            raise flat.bad(f"{where}: shape operand {value.tolist()} and new_shape "
                           f"{options['shape']} disagree")
        options["shape"] = value.tolist()
    elif op in ("PAD", "GATHER", "RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR"):
        options[key] = value.tolist()
    elif op == "SLICE":
        size = ins[2]
        t2 = next((t for t, _ in tensors if t.name == size), None)
        if t2 is None or size is None or size not in weights or t2.dtype != "int32" \
                or size in operand_of \
                or value.ndim != 1 or weights[size].shape != value.shape:
            raise flat.bad(f"{where}: begin and size must be int32 vectors of one length, used "
                           "once")
        operand_of[size] = where
        options["begin"], options["size"] = value.tolist(), weights[size].tolist()
    elif op == "PADV2":
        options[key] = value.tolist()
        options["value"] = scalar_operand(ins[2], weights, tensors, operand_of, flat, where)
    else:
        if value.ndim != 1:
            raise flat.bad(f"{where}: axes operand must be a vector, got {list(value.shape)}")
        options[key] = value.tolist()
    return ins[:1]


def scalar_operand(name: str | None, weights: Weights, tensors: list[TensorEntry],
                   operand_of: dict[str, str], flat: Flat, where: str) -> float:
    """A float32 [1] constant the writer made from an option (PADV2's value, ADD / MUL's
    scalar), used by this op alone; it becomes that option again."""
    t = next((t for t, _ in tensors if t.name == name), None)
    if t is None or name is None or name not in weights or t.dtype != "float32" \
            or tuple(t.shape) != (1,) \
            or name in operand_of or t.quant is not None:
        raise flat.bad(f"{where}: operand {name!r} must be a float32 [1] constant used once")
    operand_of[name] = where
    v = float(weights[name][0])
    if not math.isfinite(v) and not v == -math.inf:
        raise flat.bad(f"{where}: operand {name!r} is {v}")
    return v
