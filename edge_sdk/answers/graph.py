"""The runtime's own graph of a slice (it cuts the SDK's own time per call, docs/results.md):
the input's normalisation before it and the answer's softmax after it.

**The raw input.** Every interpreter the runtime builds takes the samples as the app hands them
(the manifest's input dtype, raw values, checked by ``InputChecker.feed``), not normalised
float32: before building it, the runtime puts in front of the slice's input::

    x_f = CAST(x_raw)                       # uint8 bundles only
    x   = ADD(MUL(x_f, scale), shift)       # scale = 1 / std, shift = -mean / std

so a call hands the interpreter the checked sample itself instead of normalising it in numpy
(3.5 us for a 32x32x3 uint8 image, ~0.5 us for digits' 8x8, plus the allocation). ``scale``
and ``shift`` are spread over a whole sample ``[1, H, W, C]`` (8 bytes per input element per
interpreter): the same two float32 roundings as numpy's, so the slice sees the same bytes,
and no broadcasting, which the interpreter runs slowly (a ``[1, 1, 1, C]`` pair cost +12.6 us
on a 32x32x3 image, a 1x1 ``DEPTHWISE_CONV_2D`` +3.8-6.4 us, the full-shape pair nothing
measurable against the plain slice fed numpy's normalisation). The range check stays in
Python: a NaN that a ReLU swallows would otherwise pass unnoticed.

**The answer.**
A point or head slice ends in its logits ``[S, C]`` (``S = 1`` for a point). Before building
its interpreter, the runtime appends to the verified graph what steps 4-5 of the manifest's
recipe (docs/manifest.md, "From an input to predict's answer") compute from them, as a
further output named :data:`ANSWER`::

    p_s    = SOFTMAX(logits, beta = 1 / T)              # tempered softmax of every row
    guard  = p_s + 0 * logits                           # NaN wherever a logit is not finite
    answer = MEAN(RESHAPE(guard, [-1, S, C]), axis 1)   # average the probabilities (head)

so a one-sample call reads ``answer [1, C]`` (label = its argmax, confidence = its maximum)
instead of doing the softmax in Python. Measured on the digits bundle, one thread: the ops add
0.1-0.5 us to the invoke (median of 7 alternated rounds against the plain graph; one round
varies by up to 2 us), the numpy maths they replace cost ~7 us for a head's two rows and ~2 us
for a point's row. Appending costs ~6 ms per interpreter built (read back, written again), a
first-use cost; the appended bytes live as long as their interpreter.

Why the guard: ``softmax`` of a row holding ``-inf`` is finite (``exp(-inf) = 0``), but the
runtime refuses non-finite logits (a slice that overflows is broken, not confident).
``x * 0`` is NaN exactly when ``x`` is NaN or infinite and ``+-0`` otherwise, and
``p + (+-0) = p``: the guard changes no finite answer by a bit, and a NaN survives the mean, so
the runtime refuses the call when the answer holds a NaN.

The logits stay the slice's first output, computed by the same ops on the same weights: the
appended ops only read them, so everything that reads logits (cascades, batches, the all scope,
the tests against torch) is untouched. The probabilities are float32 here (the interpreter's
precision) where the Python path computes them in float64: they agree to ~1e-7.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from edge_sdk.answers.ood_graph import OodGraph, append_ood
from edge_sdk.errors import ConfigError, SliceError
from edge_sdk.tflite.tensors import Op, Tensor
from edge_sdk.tflite.reader import read_graph
from edge_sdk.tflite.writer import write_tflite

if TYPE_CHECKING:
    from edge_sdk.tflite.graph import Graph

__all__ = ["ANSWER", "RAW_INPUT", "RawInput", "runtime_graph", "with_answer"]

#: the name of the appended output (tensor and signature name)
ANSWER = "edge_sdk_answer"
#: the name of the raw input put in front of the slice's own
RAW_INPUT = "edge_sdk_raw_input"


@dataclass(frozen=True)
class RawInput:
    """What the runtime feeds: samples of ``dtype`` ("uint8" or "float32") with the raw
    values, normalised in the graph as ``x * scale + shift`` per channel (the manifest's
    ``(x - mean) / std``)."""

    dtype: str
    scale: tuple[float, ...]
    shift: tuple[float, ...]


def runtime_graph(data: bytes, raw: RawInput | None, answer: tuple[float, int] | None,
                  what: str = "slice", ood: OodGraph | None = None) -> bytes:
    """``data`` (a verified slice) as the runtime runs it: fed ``raw`` samples (None: the
    slice's own normalised input), and with ``answer = (temperature, samples)`` the
    :data:`ANSWER` output appended when its first output is logits ``[samples, C]`` (else
    left out: the runtime then answers from the logits in Python, as before). One read and
    one write of the flatbuffer (~6 ms, part of the interpreter's first-use cost). ``ood``:
    the out-of-distribution score's ops appended after the features
    (:mod:`edge_sdk.answers.ood_graph`; left out when the slice has no features of the bank's
    size: the runtime then scores in numpy)."""
    graph, weights = read_graph(data, what)  # a fresh graph and weights dict: ours to edit
    if raw is not None:
        _raw_input(graph, weights, raw, what)
    if ood is not None:  # before the answer: it reads the slice's own outputs 0 and 1
        append_ood(graph, weights, ood)
    if answer is not None:
        _answer(graph, *answer)
    return _write(graph, weights, what)


def with_answer(data: bytes, temperature: float, samples: int, what: str = "slice"
                ) -> bytes | None:
    """``data`` with only the :data:`ANSWER` output appended; None when its graph cannot take
    it (a tensor already named so, or a first output of another shape)."""
    graph, weights = read_graph(data, what)
    return _write(graph, weights, what) if _answer(graph, temperature, samples) else None


def _write(graph: Graph, weights: dict[str, npt.NDArray[Any]], what: str) -> bytes:
    try:
        return write_tflite(graph, weights)
    except ConfigError as e:  # the writer checks the whole graph again
        raise SliceError(f"{what}: cannot build the runtime's graph ({e})") from None


def _fresh(taken: set[str], name: str) -> str:
    while name in taken:  # never shadow a name of the slice's own
        name += "_"
    taken.add(name)
    return name


def _raw_input(graph: Graph, weights: dict[str, npt.NDArray[Any]], raw: RawInput,
               what: str) -> None:
    """The raw input and its normalisation in front of the graph's one input ``[N, H, W,
    C]`` float32, which becomes an intermediate tensor of the same name."""
    if len(graph.inputs) != 1:
        raise SliceError(f"{what}: {len(graph.inputs)} inputs, the runtime feeds one")
    x = graph.tensor(graph.inputs[0])
    c = len(raw.scale)
    if x.dtype != "float32" or len(x.shape) != 4 or x.shape[-1] != c or len(raw.shift) != c:
        raise SliceError(f"{what}: input {x.name!r} is {x.dtype} {list(x.shape)}; the "
                         f"manifest's input spec normalises {c} channels of NHWC float32")
    taken = {t.name for t in graph.tensors} | set(weights)
    src = _fresh(taken, RAW_INPUT)
    graph.tensors.append(Tensor(src, tuple(x.shape), raw.dtype))
    ops: list[Op] = []
    cur = src
    if raw.dtype != "float32":
        cur = _fresh(taken, f"{RAW_INPUT}/float")
        graph.tensors.append(Tensor(cur, tuple(x.shape)))
        ops.append(Op("CAST", [src], [cur]))
    # spread over a whole sample: a broadcast [1, 1, 1, C] is slow in the interpreter (above)
    shape = tuple(x.shape)
    w, b = _fresh(taken, f"{RAW_INPUT}/scale"), _fresh(taken, f"{RAW_INPUT}/shift")
    scaled = _fresh(taken, f"{RAW_INPUT}/scaled")
    for name, v in ((w, raw.scale), (b, raw.shift)):
        weights[name] = np.ascontiguousarray(np.broadcast_to(np.asarray(v, np.float32), shape))
        graph.tensors.append(Tensor(name, shape, weight=name))
    graph.tensors.append(Tensor(scaled, shape))
    ops += [Op("MUL", [cur, w], [scaled]), Op("ADD", [scaled, b], [x.name])]
    graph.ops[:0] = ops
    graph.inputs = [src]


def _answer(graph: Graph, temperature: float, samples: int) -> bool:
    """Append the :data:`ANSWER` output; False (graph untouched) when it cannot take it."""
    logits = graph.tensor(graph.outputs[0])
    if len(logits.shape) != 2 or logits.shape[0] != samples or samples < 1:
        return False
    classes = logits.shape[1]
    names = {t.name for t in graph.tensors}
    p_s, zero, guard, rows = (f"{ANSWER}/{n}" for n in ("p_s", "zero", "guard", "rows"))
    if names & {p_s, zero, guard, rows, ANSWER}:
        return False
    shape = tuple(logits.shape)
    guarded = ANSWER if samples == 1 else guard  # a point's one row is its answer
    graph.tensors += [Tensor(p_s, shape), Tensor(zero, shape), Tensor(guarded, shape)]
    graph.ops += [Op("SOFTMAX", [logits.name], [p_s], {"beta": 1.0 / temperature}),
                  Op("MUL", [logits.name], [zero], {"scalar": 0.0}),
                  Op("ADD", [p_s, zero], [guarded])]
    if samples > 1:  # a head: the mean over its rows
        graph.tensors += [Tensor(rows, (1, samples, classes)), Tensor(ANSWER, (1, classes))]
        graph.ops += [Op("RESHAPE", [guard], [rows], {"shape": [-1, samples, classes]}),
                      Op("MEAN", [rows], [ANSWER], {"axes": [1], "keep_dims": False})]
    graph.outputs.append(ANSWER)
    return True
