"""The answer's softmax inside the slice's graph (issue 34: the SDK's microseconds).

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
runtime refuses non-finite logits (issue 36: a slice that overflows is broken, not confident).
``x * 0`` is NaN exactly when ``x`` is NaN or infinite and ``+-0`` otherwise, and
``p + (+-0) = p``: the guard changes no finite answer by a bit, and a NaN survives the mean, so
the runtime refuses the call when the answer holds a NaN.

The logits stay the slice's first output, computed by the same ops on the same weights: the
appended ops only read them, so everything that reads logits (cascades, batches, the all scope,
the tests against torch) is untouched. The probabilities are float32 here (the interpreter's
precision) where the Python path computes them in float64: they agree to ~1e-7.
"""
from __future__ import annotations

from edge_sdk.errors import ConfigError, SliceError
from edge_sdk.graph import Op, Tensor
from edge_sdk.tflite_reader import read_graph
from edge_sdk.tflite_writer import write_tflite

__all__ = ["ANSWER", "with_answer"]

#: the name of the appended output (tensor and signature name)
ANSWER = "edge_sdk_answer"


def with_answer(data: bytes, temperature: float, samples: int, what: str = "slice"
                ) -> bytes | None:
    """``data`` (a verified point or head slice whose first output is its logits
    ``[samples, C]`` at batch 1) with the :data:`ANSWER` output appended; None when its
    graph cannot take it (a tensor already named so, or a first output of another shape),
    in which case the runtime answers from the logits in Python, as before."""
    graph, weights = read_graph(data, what)
    logits = graph.tensor(graph.outputs[0])
    if len(logits.shape) != 2 or logits.shape[0] != samples or samples < 1:
        return None
    classes = logits.shape[1]
    names = {t.name for t in graph.tensors}
    p_s, zero, guard, rows = (f"{ANSWER}/{n}" for n in ("p_s", "zero", "guard", "rows"))
    if names & {p_s, zero, guard, rows, ANSWER}:
        return None
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
    try:
        return write_tflite(graph, weights)
    except ConfigError as e:  # the writer checks the whole graph again
        raise SliceError(f"{what}: cannot append the answer's softmax ({e})") from None
