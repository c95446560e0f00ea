"""The point-slice exporter: a truncated model -> graph description -> ``.tflite`` bytes.

:func:`export_point_slice` lowers the model's fx graph (:mod:`exporters.lowering`) with its
folded, routed weights (:mod:`exporters.weights`) into a graph description
(:mod:`edge_sdk.tflite.graph`) and writes it with the device-side writer
(:mod:`edge_sdk.tflite.writer`): one lowering and one writer for every architecture.
Weight routes: int8 per-channel + DEQUANTIZE (exact, the default), hybrid (int8 filters
straight into CONV_2D / FULLY_CONNECTED) or float32.
"""
from __future__ import annotations

from typing import Collection, Sequence

import numpy as np

from edge_sdk.tflite.model_info import _Reader
from edge_sdk.errors import ConfigError
from edge_sdk.tflite.graph import Graph, graph_stats as _graph_stats
from edge_sdk.tflite.build import GraphBuilder
from edge_sdk.tflite.schema import BUILTIN_CODES
from edge_sdk.tflite.writer import write_tflite
from exporters.lowering import lower
from exporters.weights import (ChannelQuant, LayerWeights, QuantizedTensor, prepare_weights,
                               quantize_per_channel)
from trainer.layers import BayesNestedLayer
from trainer.models.base import NestedModel

__all__ = ["ChannelQuant", "GraphBuilder", "LayerWeights", "QuantizedTensor", "SIGNATURE_KEY",
           "export_point_slice", "graph_stats", "lower_point_slice", "prepare_weights",
           "quantize_per_channel"]

SIGNATURE_KEY = "serving_default"
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
# the second output: the final linear classifier's input, [N, D], read by the
# device's out-of-distribution score (edge_sdk.answers.uncertainty)
FEATURES_NAME = "features"
_OP_NAMES = {v: k for k, v in BUILTIN_CODES.items()}
_WEIGHTED = (BUILTIN_CODES["CONV_2D"], BUILTIN_CODES["DEPTHWISE_CONV_2D"],
             BUILTIN_CODES["FULLY_CONNECTED"])


def graph_stats(graph: Graph | bytes) -> dict:
    """MACs, parameters and op counts of a graph description (:func:`edge_sdk.tflite.graph.graph_stats`)
    or of written ``.tflite`` bytes (read back with the runtime's stdlib reader, the same
    rules: conv ``H_out W_out C_out kh kw C_in``, depthwise ``H_out W_out C kh kw``, fully
    connected ``in x out`` per row; parameters = filter + bias elements)."""
    if isinstance(graph, Graph):
        return _graph_stats(graph)
    r = _Reader(bytes(graph), "model")
    model = r.root()
    codes = [max(r.scalar(oc, 0, "<b", 0), r.scalar(oc, 3, "<i", 0))
             for oc in r.tables(r.ref(model, 1))]
    sg = r.tables(r.ref(model, 2))[0]
    shapes = [r.ints(r.ref(t, 0)) for t in r.tables(r.ref(sg, 0))]
    macs = params = 0
    ops: dict[str, int] = {}
    for op in r.tables(r.ref(sg, 3)):
        code = codes[r.scalar(op, 0, "<I", 0)]
        name = _OP_NAMES.get(code, str(code))
        ops[name] = ops.get(name, 0) + 1
        if code not in _WEIGHTED:
            continue
        ins, (out,) = r.ints(r.ref(op, 1)), r.ints(r.ref(op, 2))
        filt = shapes[ins[1]]
        macs += int(np.prod(shapes[out][:-1])) * int(np.prod(filt))
        params += int(np.prod(filt))
        if len(ins) > 2 and ins[2] >= 0:
            params += int(np.prod(shapes[ins[2]]))
    return {"macs": macs, "params": params, "ops": ops}


def export_point_slice(model: NestedModel, input_shape_nhwc: Sequence[int],
                       weights: str = "dequantize", pow2_step: bool = False,
                       output_shape: Sequence[int] | None = None,
                       sampled: Collection[str] = (), features: bool = False
                       ) -> tuple[bytes, dict]:
    """The point network of a truncated model as a ``.tflite`` flatbuffer, and facts about it.

    Input ``"input"``: float32 NHWC, already normalised (normalising is the runtime's job).
    Output ``"logits"``: ``[N, num_classes]``. Signature ``serving_default``. The batch
    dimension is resizable (``resize_tensor_input(0, [N, H, W, C])``; -1 in the input's and
    output's shape signature): a head graph then answers ``[N * S, C]``. ``weights``:
    ``"dequantize"`` (int8 per-channel + DEQUANTIZE), ``"hybrid"`` (int8 filters straight into
    CONV_2D / FULLY_CONNECTED, activations quantized per invoke; depthwise filters stay on the
    DEQUANTIZE route) or ``"float"``; ``pow2_step`` and ``sampled``: see
    :func:`prepare_weights`.

    Batch norms fold with their running statistics (eval semantics) whatever ``model.training``
    says; note ``truncate()`` returns rebuilt batch norms in training mode, so call ``eval()``
    before comparing with torch.

    ``output_shape``: reshape the logits before the output (the head scope's ``[S, C]`` from a
    classifier whose S sampled heads are stacked into one ``[S*C, in]`` FULLY_CONNECTED).

    ``info``: ``macs`` and ``params`` (counted from the graph description written), ``ops`` (count by op),
    ``bytes``, ``tensors`` (per layer: TFLite weight shape, route, whether int8 x scale equals
    the folded float weight exactly), ``float_fallback`` (layers that could not be exact in
    ``pow2_step`` mode and stayed float), ``input``/``output`` (name, shape).
    """
    still_nested = [n for n, m in model.named_modules()
                    if isinstance(m, BayesNestedLayer) and m.ordering is not None]
    if still_nested:
        raise ConfigError(f"{type(model).__name__} is not truncated ({still_nested[0]} still has "
                          "an ordering unit): export model.truncate(width)")
    shape = tuple(input_shape_nhwc)
    if len(shape) != 4 or not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape):
        raise ConfigError(f"input_shape_nhwc must be 4 positive ints [N, H, W, C], got {shape}")

    graph, arrays, records = lower_point_slice(model, shape, weights, pow2_step, output_shape,
                                               sampled, features)
    buf = write_tflite(graph, arrays)
    info = graph_stats(graph)
    out = graph.tensor(OUTPUT_NAME)
    info.update(bytes=len(buf), weights=weights, pow2_step=pow2_step, tensors=records,
                float_fallback=[r["layer"] for r in records
                                if pow2_step and weights != "float" and r["route"] == "float"],
                input={"name": INPUT_NAME, "shape": list(shape)},
                output={"name": OUTPUT_NAME, "shape": list(out.shape)})
    if FEATURES_NAME in graph.outputs:
        info["features"] = {"name": FEATURES_NAME,
                            "shape": list(graph.tensor(FEATURES_NAME).shape)}
    return buf, info


def lower_point_slice(model: NestedModel, input_shape_nhwc: Sequence[int],
                      weights: str = "dequantize", pow2_step: bool = False,
                      output_shape: Sequence[int] | None = None, sampled: Collection[str] = (),
                      features: bool = False
                      ) -> tuple[Graph, dict[str, np.ndarray], list[dict]]:
    """The graph description :func:`export_point_slice` writes, its weights (by name) and the
    per-layer weight records (see ``info["tensors"]`` there). ``features``: also output the
    final linear classifier's input as a second output ``"features"`` ``[N, D]`` (the
    out-of-distribution score reads it); ConfigError when the logits do not come from a
    linear layer."""
    lw = prepare_weights(model, weights, pow2_step, sampled)
    g = GraphBuilder()
    x = g.add_input(INPUT_NAME, tuple(input_shape_nhwc))
    feats: list[str] = []
    y, records = lower(model, g, x, lw, feats)
    if features and (not feats or feats[0] == x):
        raise ConfigError("the out-of-distribution features are the final linear layer's "
                          "input: this model's logits do not come from a linear layer on a "
                          "computed tensor (export with uncertainty off)")
    if output_shape is not None:
        # [N, S*C] -> [N*S, C]: rows n*S .. n*S+S-1 are sample n's (batch-resizable, as flatten)
        rows = tuple(output_shape)
        y = g.reshape(y, (-1, *rows[1:]), name="heads")
        if g.shape(y) != rows:
            raise ConfigError(f"output_shape {list(rows)} does not fit the graph's output "
                              f"{list(g.shape(y))} at batch {input_shape_nhwc[0]}")
    g.mark_output(y, OUTPUT_NAME)
    if features:
        g.mark_output(feats[0], FEATURES_NAME)
    graph, arrays = g.graph(resizable_batch=True)
    return graph, arrays, records
