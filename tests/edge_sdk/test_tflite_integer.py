"""Integer slices (edge_sdk.tflite.integer): a float graph description with calibrated activation
ranges becomes int8 kernels end to end; written, parsed back and run on the backend the device
tests run on (LiteRT, or tflite-runtime 2.14), against the float graph it came from."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk.backends import interpreter_class
from edge_sdk.errors import ConfigError
from edge_sdk.tflite.build import GraphBuilder
from edge_sdk.tflite.integer import (QMAX, QMIN, activation_quant, activation_tensors,
                                     calibration_graph, integer_graph, quant_params)
from edge_sdk.tflite.model_info import read_ops
from edge_sdk.tflite.reader import read_graph
from edge_sdk.tflite.schema import BUILTIN_CODES
from edge_sdk.tflite.tensors import Quantization
from edge_sdk.tflite.writer import write_tflite

Interpreter = interpreter_class()[0]
RNG = np.random.default_rng(0)


def normal(scale: float, shape) -> np.ndarray:
    return RNG.normal(0, scale, shape).astype(np.float32)


def _float_graph(relu_last: bool = False):
    """A small CNN using every op an integer graph holds: conv (an int8 filter behind a
    DEQUANTIZE, as the exporter's default route writes it) + ReLU, pad, depthwise conv,
    concatenation, add, max and average pooling, ReLU6, mean, two fully connected layers (the
    first one's input is the second output, "features") and a reshape."""
    g = GraphBuilder()
    x = g.add_input("input", (1, 8, 8, 3))
    q = RNG.integers(-127, 128, (6, 3, 3, 3), dtype=np.int8)
    wq = g.add_const(q, "c1/w_int8", Quantization(tuple(float(v) for v in np.float32(RNG.uniform(0.002, 0.02, 6))), 0))
    c1 = g.conv2d(x, g.dequantize(wq, "c1/w"), g.add_const(normal(.1, 6), "c1/b"),
                  padding="SAME", activation="relu", name="c1")
    p = g.pad(c1, [(0, 0), (1, 1), (1, 1), (0, 0)], name="pad")
    dw = g.depthwise_conv2d(p, g.add_const(normal(.3, (1, 3, 3, 6)), "dw/w"),
                            g.add_const(normal(.1, 6), "dw/b"), padding="VALID", name="dw")
    cat = g.concatenation([c1, dw], 3, name="cat")
    c2 = g.conv2d(cat, g.add_const(normal(.2, (12, 1, 1, 12)), "c2/w"),
                  g.add_const(normal(.1, 12), "c2/b"), name="c2")
    c3 = g.conv2d(cat, g.add_const(normal(.2, (12, 1, 1, 12)), "c3/w"), None, name="c3")
    s = g.add(c2, c3, activation="relu", name="sum")
    mp = g.max_pool2d(s, 2, name="mp")
    ap = g.average_pool2d(mp, 2, 1, name="ap")
    r6 = g.relu6(ap, name="r6")
    m = g.mean(r6, (1, 2), name="gap")
    fc = g.fully_connected(m, g.add_const(normal(.3, (16, 12)), "fc/w"),
                           g.add_const(normal(.1, 16), "fc/b"), activation="relu",
                           name="fc")
    out = g.fully_connected(fc, g.add_const(normal(.3, (5, 16)), "out/w"),
                            g.add_const(normal(.1, 5), "out/b"),
                            activation="relu" if relu_last else None, name="logits_2d")
    out = g.reshape(out, (-1, 5), name="logits")
    g.mark_output(out, "logits")
    g.mark_output(fc, "features")
    return g.graph(resizable_batch=True)


def _ranges(graph, weights, xs: np.ndarray) -> dict[str, tuple[float, float]]:
    """Each activation tensor's min and max over ``xs`` (the float graph with every activation
    an output: edge_sdk.tflite.integer.calibration_graph)."""
    got = _run(write_tflite(calibration_graph(graph), weights), xs)
    return {n: (float(got[n].min()), float(got[n].max())) if n in got else
            (float(xs.min()), float(xs.max())) for n in activation_tensors(graph)}


def _run(buf: bytes, xs: np.ndarray) -> dict[str, np.ndarray]:
    it = Interpreter(model_content=buf, num_threads=1)
    it.resize_tensor_input(0, list(xs.shape))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], xs)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


@pytest.fixture(scope="module")
def converted():
    graph, weights = _float_graph()
    fbuf = write_tflite(graph, weights)
    calib = normal(1, (256, 8, 8, 3)).astype(np.float32)
    quant = activation_quant(graph, _ranges(graph, weights, calib))
    g8, w8 = integer_graph(graph, weights, quant)
    return graph, weights, fbuf, quant, g8, w8, write_tflite(g8, w8)


def test_an_integer_graph_tracks_its_float_graph_on_int8_kernels(converted):
    graph, _, fbuf, quant, g8, _, ibuf = converted
    xs = normal(1, (200, 8, 8, 3)).astype(np.float32)
    want, got = _run(fbuf, xs), _run(ibuf, xs)
    for name in ("logits", "features"):
        assert got[name].dtype == np.float32 and got[name].shape == want[name].shape
        # int8 rounding through eleven ops of a random network: a few output steps on
        # average, a small share of the output's range at worst
        span = 255 * quant[name][0]
        err = np.abs(got[name] - want[name])
        assert err.mean() <= 0.01 * span and err.max() <= 0.08 * span, (name, err.max() / span)
    assert (got["logits"].argmax(1) == want["logits"].argmax(1)).mean() >= 0.9
    kinds = {t.name: t.dtype for t in g8.tensors if t.weight is None}
    assert kinds.pop("input") == kinds.pop("logits") == kinds.pop("features") == "float32"
    assert set(kinds.values()) == {"int8"}  # every activation inside runs int8 kernels
    assert [o.op for o in g8.ops].count("DEQUANTIZE") == 2  # the outputs only
    assert [o.op for o in g8.ops][0] == "QUANTIZE"


def test_the_integer_slice_reads_back_as_written_with_tflite_s_op_versions(converted):
    *_, g8, w8, ibuf = converted
    back, weights = read_graph(ibuf)  # what the runtime does before any interpreter sees it
    assert {t.name: (t.dtype, t.shape, t.quant) for t in back.tensors} == \
        {t.name: (t.dtype, t.shape, t.quant) for t in g8.tensors}
    for name, a in w8.items():
        assert np.array_equal(weights[name], a) and weights[name].dtype == a.dtype
    names = {code: name for name, code in BUILTIN_CODES.items()}
    versions: dict[str, set[int]] = {}
    for op in read_ops(ibuf, "int8"):
        versions.setdefault(names[op.code], set()).add(op.version)
    # TFLite's op_version.cc for int8 inputs and outputs
    assert versions["CONV_2D"] == versions["DEPTHWISE_CONV_2D"] == {3}
    assert versions["FULLY_CONNECTED"] == {4}
    assert versions["MAX_POOL_2D"] == versions["MEAN"] == versions["ADD"] == {2}


def test_filters_behind_dequantize_keep_their_codes_and_biases_are_int32(converted):
    graph, weights, _, quant, g8, w8, _ = converted
    by = {t.name: t for t in g8.tensors}
    assert np.array_equal(w8["c1/filter"], weights["c1/w_int8"])  # the exporter's codes
    assert by["c1/filter"].quant.scale == graph.tensor("c1/w_int8").quant.scale
    dw = by["dw/filter"]
    assert dw.quant.axis == 3 and len(dw.quant.scale) == 6  # depthwise: per channel of axis 3
    b = by["c1/bias"]
    assert b.dtype == "int32" and w8["c1/bias"].dtype == np.int32
    in_scale = quant["input"][0]
    want = np.float32(in_scale) * np.asarray(by["c1/filter"].quant.scale, np.float32)
    assert np.allclose(b.quant.scale, want, rtol=1e-6)
    assert np.all(w8["c3/bias"] == 0)  # a conv without a bias gets int32 zeros


def test_ops_that_keep_their_input_s_quantization_share_one(converted):
    graph, _, _, quant, *_ = converted
    assert quant["pad"] == quant["c1"]  # a pad's padding value is the input's zero
    assert quant["cat"] == quant["c1"] == quant["dw"]  # concatenated inputs and output
    assert quant["mp"] == quant["sum"] and quant["ap"] == quant["mp"]
    assert quant["logits"] == quant["logits_2d"]


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e4, 1e4), st.floats(0, 1e4))
def test_quant_params_cover_the_range_and_hold_zero_exactly(lo, span):
    hi = lo + span
    scale, zero = quant_params(lo, hi)
    assert scale > 0 and QMIN <= zero <= QMAX
    assert scale == float(np.float32(scale))  # what the file stores
    lo0, hi0 = min(lo, 0.0), max(hi, 0.0)
    if hi0 > lo0:
        assert scale * (QMIN - zero) <= lo0 + scale / 2 + 1e-9 * abs(lo0)
        assert scale * (QMAX - zero) >= hi0 - scale / 2 - 1e-9 * abs(hi0)
    if lo >= 0:
        assert zero == QMIN  # a ReLU's output: all 256 steps above 0


def test_bad_ranges_and_unsupported_ops_are_config_errors(converted):
    graph, weights, *_ = converted
    for lo, hi in ((1.0, 0.0), (float("nan"), 1.0), (0.0, float("inf"))):
        with pytest.raises(ConfigError, match="activation range"):
            quant_params(lo, hi)
    names = activation_tensors(graph)
    with pytest.raises(ConfigError, match="no calibrated range for activation"):
        activation_quant(graph, {n: (0.0, 1.0) for n in names[1:]})
    q = activation_quant(graph, {n: (-1.0, 1.0) for n in names})
    with pytest.raises(ConfigError, match="no quantization for activation"):
        integer_graph(graph, weights, {k: v for k, v in q.items() if k != "mp"})
    bad = dict(q, sum=(0.0, 3))
    with pytest.raises(ConfigError, match="positive finite scale"):
        integer_graph(graph, weights, bad)
    g = GraphBuilder()
    x = g.add_input("input", (1, 4))
    g.mark_output(g.softmax(x, name="p"), "p")
    with pytest.raises(ConfigError, match="SOFTMAX .* no integer kernel"):
        activation_tensors(g.graph()[0])
