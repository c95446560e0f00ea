"""Our integer slices against the maintained reference: ai-edge-quantizer's static int8 recipe
(``static_wi8_ai8``) quantizes the very float slice we export, with the activation ranges our
calibration measured, and must compute what our integer slice computes (the same scales and
zero points, logits within one quantization step, top-1 equal on >= 99.5 % of inputs)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from ai_edge_litert.interpreter import Interpreter

from edge_sdk.tflite.integer import _groups, activation_quant, integer_graph
from edge_sdk.tflite.writer import write_tflite
from exporters.precision import activation_ranges, integer_slice
from exporters.tflite import lower_point_slice
from support import randomise
from trainer.models import create_model

aeq = pytest.importorskip("ai_edge_quantizer", reason="ai-edge-quantizer (the dev extra)")
torch.set_num_threads(1)
CASES = [("nested_cnn_small", {}, (8, 8, 1)), ("nested_allconv", {"width_mult": 0.25},
                                                (32, 32, 3))]


def _run(buf: bytes, xs: np.ndarray) -> tuple[np.ndarray, tuple[float, int] | None]:
    """Logits of ``xs`` (the reference's int8 input and output quantized and dequantized
    here, as an app around it would) and the logits' quantization."""
    it = Interpreter(model_content=buf, num_threads=1)
    it.resize_tensor_input(0, list(xs.shape))
    it.allocate_tensors()
    inp = it.get_input_details()[0]
    x = xs
    if inp["dtype"] == np.int8:
        s, z = inp["quantization"]
        x = np.clip(np.round(xs / s) + z, -128, 127).astype(np.int8)
    it.set_tensor(inp["index"], x)
    it.invoke()
    out = [d for d in it.get_output_details() if d["name"] == "logits"][0]
    y = it.get_tensor(out["index"])
    if out["dtype"] == np.int8:
        s, z = out["quantization"]
        return (y.astype(np.float32) - z) * s, (s, z)
    return y, None


@pytest.mark.parametrize("name,kw,hwc", CASES)
def test_our_integer_slice_is_ai_edge_quantizer_s_with_the_same_ranges(name, kw, hwc):
    torch.manual_seed(0)
    model = create_model(name, **kw).eval()
    randomise(model, 1)
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((256, *hwc)).astype(np.float32)
    xs = rng.standard_normal((1000, *hwc)).astype(np.float32)
    for width in (0.5, 1.0):
        graph, weights, _ = lower_point_slice(model.truncate(width).eval(), (1, *hwc), "float",
                                              features=True)
        ranges = activation_ranges(graph, weights, calib, "minmax")
        quant = activation_quant(graph, ranges)
        ours = write_tflite(*integer_graph(graph, weights, quant))
        # the reference gets each tensor's range as ours has it (a group sharing one
        # quantization: the union of its members' ranges, which the reference then keeps)
        group = _groups(graph)
        span: dict[str, tuple[float, float]] = {}
        for t, g in group.items():
            lo, hi = span.get(g, (np.inf, -np.inf))
            span[g] = (min(lo, ranges[t][0]), max(hi, ranges[t][1]))
        calibration = {t: {"min": np.array(min(span[g][0], 0.0), np.float32),
                           "max": np.array(max(span[g][1], 0.0), np.float32)}
                       for t, g in group.items()}
        q = aeq.quantizer.Quantizer(write_tflite(graph, weights),
                                    aeq.recipe.static_wi8_ai8())
        reference = bytes(q.quantize(calibration).quantized_model)
        got, _ = _run(ours, xs)
        want, (step, zero) = _run(reference, xs)
        assert (step, zero) == pytest.approx(quant["logits"], rel=1e-6)
        assert np.abs(got - want).max() <= step * 1.0001, (name, width)
        assert (got.argmax(1) == want.argmax(1)).mean() >= 0.995, (name, width)


def test_the_calibration_kept_is_the_lowest_validation_nll():
    torch.manual_seed(0)
    model = create_model("nested_cnn_small").eval()
    randomise(model, 2)
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((128, 8, 8, 1)).astype(np.float32)
    val_x = rng.standard_normal((200, 8, 8, 1)).astype(np.float32)
    graph, weights, _ = lower_point_slice(model.truncate(1.0).eval(), (1, 8, 8, 1), "float")
    val_y = _run(write_tflite(graph, weights), val_x)[0].argmax(1)  # the float slice's labels
    made = integer_slice(graph, weights, calib, val_x, val_y)
    assert set(made.screened) == {"minmax", "p99.99"}
    assert made.screened[made.calibration]["nll"] == min(r["nll"] for r in
                                                        made.screened.values())
    assert made.screened[made.calibration]["accuracy"] >= 0.9  # int8 tracks its float slice
    lo, hi = activation_ranges(graph, weights, calib, "p99.99")["input"]
    assert calib.min() <= lo <= hi <= calib.max()  # the percentile clips inside the extremes
