"""TFLite writer and point-slice exporter: LiteRT logits == torch, folding, int8 parameters."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter
from hypothesis import given, settings, strategies as st

from edge_sdk.errors import ConfigError
from exporters.fold import fold_layer, fold_scale
from exporters.weights import with_graph_weights
from exporters.tflite import (ChannelQuant, GraphBuilder, export_point_slice, graph_stats,
                              prepare_weights, quantize_per_channel)
from trainer.layers import BayesNestedConv2d, BayesNestedLayer, BayesNestedLinear
from trainer.models import create_model, list_models
from support import randomise

torch.set_num_threads(1)

# Reduced width multipliers keep the file fast; the code paths are those of the full models.
CASES = {
    "nested_cnn_small": ({}, (8, 8, 1)),
    "nested_cnn_small@28": ({"input_size": 28}, (28, 28, 1)),
    "nested_vgg": ({"width_mult": 0.25}, (32, 32, 3)),
    "nested_vgg@gap": ({"width_mult": 0.25, "hidden": 0}, (32, 32, 3)),  # no hidden dense layer
    "nested_mobilenetv2": ({"width_mult": 0.5}, (32, 32, 3)),
    # issue 20's registry: nest(...) of plain definitions
    "resnet20_cifar": ({"residual": "stage", "nest_stem": True}, (32, 32, 3)),
    "mobilenet_v2": ({"width_mult": 0.75}, (32, 32, 3)),
    "nested_allconv": ({"width_mult": 0.5}, (32, 32, 3)),
}
WIDTHS = [0.25, 0.5, 1.0]


_models = {}


def model_for(case):
    if case not in _models:
        kw, _ = CASES[case]
        torch.manual_seed(0)
        model = create_model(case.split("@")[0], **kw).double().eval()
        randomise(model, 1)
        _models[case] = model
    return _models[case]


def inputs(case, batch=2, seed=0):
    return np.random.default_rng(seed).standard_normal((batch,) + CASES[case][1]).astype(np.float32)


def run_tflite(buf, x):
    interp = Interpreter(model_content=buf, num_threads=1)
    assert interp.get_signature_list() == {"serving_default": {"inputs": ["input"],
                                                               "outputs": ["logits"]}}
    return interp.get_signature_runner("serving_default")(input=x)["logits"]


def run_torch(model, x):
    with torch.no_grad():
        return model(torch.from_numpy(x).double().permute(0, 3, 1, 2)).numpy()




def torch_macs_and_params(model, x):
    """MACs and folded parameters counted on the torch side with forward hooks."""
    macs = []

    def hook(layer, args, out):
        if isinstance(layer, BayesNestedConv2d):
            groups = layer.conv_groups
            macs.append(out[0].numel() * out.shape[0] * layer.kernel_size ** 2
                        * layer.in_channels // groups)
        else:
            macs.append(out.shape[0] * layer.in_features * layer.out_features)

    layers = [m for m in model.modules() if isinstance(m, BayesNestedLayer)]
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        run_torch(model, x)
    finally:
        for h in handles:
            h.remove()
    params = sum(m.weight_mu.numel() + m.out_channels for m in layers)  # every folded op has a bias
    return sum(macs), params


def rel_err(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_every_registered_model_is_covered():
    assert {k.split("@")[0] for k in CASES} == set(list_models())


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("width", WIDTHS)
def test_slice_logits_match_torch(case, width):
    small = model_for(case).truncate(width).eval()
    x = inputs(case)
    ref = run_torch(small, x)

    # Float route: only float32 vs float64 arithmetic separates the two.
    buf, info = export_point_slice(small, x.shape, weights="float")
    assert rel_err(run_tflite(buf, x), ref) <= 1e-5
    assert {t["route"] for t in info["tensors"]} == {"float"}

    # DEQUANTIZE route: against torch running the graph's int8 x scale weights.
    buf, info = export_point_slice(small, x.shape, weights="dequantize")
    assert {t["route"] for t in info["tensors"]} == {"dequantize"}
    out = run_tflite(buf, x)
    assert out.shape == (x.shape[0], 10) and info["output"]["shape"] == [x.shape[0], 10]
    dequantized = with_graph_weights(small, prepare_weights(small, "dequantize"))
    assert rel_err(out, run_torch(dequantized, x)) <= 1e-5
    # int8 rounding is the only other difference from the float network (bounded, not zero).
    assert 0 < rel_err(out, ref) < 0.1

    macs, params = torch_macs_and_params(small, x)
    assert (info["macs"], info["params"]) == (macs, params)


def snap_to_pow2_grid(model, skip=()):
    """PWFN-like point weights: every tensor on a power-of-two grid with at most 127 steps per
    side (any such integer is a sum of powers of two), except the layers named in ``skip``."""
    with torch.no_grad():
        for name, layer in model.named_modules():
            if isinstance(layer, BayesNestedLayer) and name not in skip:
                w = layer.weight_mu
                step = 2.0 ** np.ceil(np.log2(w.abs().max().item() / 127))
                w.copy_(torch.round(w / step).clamp(-127, 127) * step)


@pytest.mark.parametrize("case", ["nested_cnn_small", "nested_mobilenetv2"])
def test_codebook_weights_survive_exactly(case):
    # truncate() returns a copy (snapping leaves the cached model alone) whose rebuilt batch
    # norms are in training mode: eval() so torch uses the running statistics the graph folds.
    small = model_for(case).truncate(0.5).eval()
    names = [n for n, m in small.named_modules() if isinstance(m, BayesNestedLayer)]
    off_grid = names[1]  # stays a random float tensor: cannot be exact, must fall back to float
    snap_to_pow2_grid(small, skip={off_grid})
    x = inputs(case)
    buf, info = export_point_slice(small, x.shape, weights="dequantize", pow2_step=True)

    assert info["float_fallback"] == [off_grid]
    routes = {t["layer"]: (t["route"], t["exact"]) for t in info["tensors"]}
    assert routes == {n: ("float", None) if n == off_grid else ("dequantize", True) for n in names}
    # Exact weights: the bound against the unquantized torch network holds (and more).
    assert rel_err(run_tflite(buf, x), run_torch(small, x)) <= 1e-5

    # Read back from the file: int8 x scale == codebook value x recorded fold scale, bit for bit.
    model = schema.ModelT.InitFromPackedBuf(buf, 0)
    tensors = model.subgraphs[0].tensors
    layers = dict(small.named_modules())
    checked = 0
    for t in tensors:
        name = t.name.decode()
        if not name.endswith("/weight_int8"):
            continue
        layer = layers[name[: -len("/weight_int8")]]
        q = model.buffers[t.buffer].data.view(np.int8).reshape(t.shape)
        scale = np.asarray(t.quantization.scale, np.float32)
        axis = t.quantization.quantizedDimension
        shape = [1] * q.ndim
        shape[axis] = -1
        got = q.astype(np.float32) * scale.reshape(shape)
        mu = layer.weight_mu.detach().numpy().astype(np.float32)
        want = mu * fold_scale(layer).reshape((-1,) + (1,) * (mu.ndim - 1))
        if getattr(layer, "depthwise", False):
            want = want.transpose(1, 2, 3, 0)
        elif mu.ndim == 4:
            want = want.transpose(0, 2, 3, 1)
        elif layer.input_spatial > 1:
            h = w = int(round(layer.input_spatial ** 0.5))
            o = mu.shape[0]
            want = want.reshape(o, -1, h, w).transpose(0, 2, 3, 1).reshape(o, -1)
        assert np.array_equal(got, want), name
        checked += 1
    assert checked == len(names) - 1


def test_int8_parameters_read_back_from_the_file():
    case = "nested_mobilenetv2"  # has CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED filters
    small = model_for(case).truncate(0.5)
    buf, _ = export_point_slice(small, inputs(case).shape, weights="dequantize")
    assert buf[4:8] == b"TFL3"
    model = schema.ModelT.InitFromPackedBuf(buf, 0)
    assert model.version == 3
    assert model.buffers[0].data is None or len(model.buffers[0].data) == 0
    assert [s.signatureKey.decode() for s in model.signatureDefs] == ["serving_default"]
    op = schema.BuiltinOperator
    for oc in model.operatorCodes:
        assert oc.deprecatedBuiltinCode == min(oc.builtinCode, 127)
        assert oc.version == (5 if oc.builtinCode == op.DEQUANTIZE else 1)

    sg = model.subgraphs[0]
    consumer = {i: model.operatorCodes[o.opcodeIndex].builtinCode
                for o in sg.operators for i in o.inputs}
    seen = set()
    for o in sg.operators:
        if model.operatorCodes[o.opcodeIndex].builtinCode != op.DEQUANTIZE:
            continue
        t = sg.tensors[o.inputs[0]]
        q = model.buffers[t.buffer].data.view(np.int8)
        quant = t.quantization
        assert t.type == schema.TensorType.INT8
        assert q.size == np.prod(t.shape) and q.min() >= -127 and q.max() <= 127
        assert quant.zeroPoint.dtype == np.int64 and not quant.zeroPoint.any()
        assert quant.scale.dtype == np.float32 and (quant.scale > 0).all()
        user = consumer[o.outputs[0]]
        seen.add(user)
        assert quant.quantizedDimension == (3 if user == op.DEPTHWISE_CONV_2D else 0)
        assert len(quant.scale) == t.shape[quant.quantizedDimension]
    assert seen == {op.CONV_2D, op.DEPTHWISE_CONV_2D, op.FULLY_CONNECTED}

    # Buffer data sits on 16-byte boundaries (schema: force_align 16).
    root = schema.Model.GetRootAs(buf, 0)
    base = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
    for i in range(1, root.BuffersLength()):
        data = root.Buffers(i).DataAsNumpy()
        assert (data.__array_interface__["data"][0] - base) % 16 == 0


def _depthwise_stride2_graph(x_shape, w, padding):
    g = GraphBuilder()
    x = g.add_input("input", x_shape)
    filt = g.add_const(w.transpose(1, 2, 3, 0), "filter")  # [C,1,3,3] -> [1,3,3,C]
    if padding == "PAD":
        x = g.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)], name="pad")
    y = g.depthwise_conv2d(x, filt, None, stride=2, padding="VALID" if padding == "PAD" else "SAME",
                           name="dw")
    g.mark_output(y, "logits")
    return g.finish()


def test_stride2_needs_explicit_pad():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 8, 4)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    ref = F.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(w), stride=2,
                   padding=1, groups=4).permute(0, 2, 3, 1).numpy()
    padded = run_tflite(_depthwise_stride2_graph(x.shape, w, "PAD"), x)
    same = run_tflite(_depthwise_stride2_graph(x.shape, w, "SAME"), x)
    assert padded.shape == same.shape == ref.shape
    assert rel_err(padded, ref) <= 1e-6
    assert rel_err(same, ref) > 0.1  # TFLite SAME pads only bottom/right here: a different conv

    # The exporter takes the PAD path for every stride-2 conv (MobileNetV2 has three).
    small = model_for("nested_mobilenetv2").truncate(0.25)
    stride2 = sum(1 for m in small.modules() if isinstance(m, BayesNestedConv2d) and m.stride == 2)
    _, info = export_point_slice(small, inputs("nested_mobilenetv2").shape)
    assert stride2 == info["ops"]["PAD"] == 3


def test_builder_pooling_add_reshape_softmax():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 6, 6, 4)).astype(np.float32)
    fc_w = rng.standard_normal((3, 144)).astype(np.float32)
    conv_w = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    g = GraphBuilder()
    xi = g.add_input("input", x.shape)
    conv = g.conv2d(xi, g.add_const(conv_w.transpose(0, 2, 3, 1), "conv_w"), None, stride=1,
                    padding="SAME", name="conv")  # no bias: the builder supplies zeros
    pooled = g.add(g.max_pool2d(xi, 2, name="max"), g.average_pool2d(xi, 2, name="avg"),
                   activation="relu", name="sum")
    probs = g.softmax(g.mean(pooled, (1, 2), name="mean"), name="softmax")
    fc = g.fully_connected(g.reshape(xi, (1, 144), name="flat"), g.add_const(fc_w, "w"), None,
                           activation="relu6", name="fc")
    g.mark_output(probs, "probs")
    g.mark_output(fc, "fc")
    g.mark_output(conv, "conv")
    out = Interpreter(model_content=g.finish(), num_threads=1).get_signature_runner()(input=x)

    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
    np.testing.assert_allclose(out["conv"], F.conv2d(xt, torch.from_numpy(conv_w), padding=1)
                               .permute(0, 2, 3, 1).numpy(), rtol=1e-5, atol=1e-5)
    pooled_ref = F.relu(F.max_pool2d(xt, 2) + F.avg_pool2d(xt, 2))
    np.testing.assert_allclose(out["probs"], F.softmax(pooled_ref.mean((2, 3)), -1).numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["fc"], F.relu6(torch.from_numpy(x.reshape(1, -1) @ fc_w.T)),
                               rtol=1e-5, atol=1e-5)
    assert graph_stats(g.finish())["macs"] == 144 * 3 + 6 * 6 * 2 * 9 * 4


# ---- folding -------------------------------------------------------------------------------
def _layer(kind, activation, batch_norm):
    torch.manual_seed(0)
    if kind == "linear":
        layer = BayesNestedLinear(12, 8, batch_norm=batch_norm, activation=activation)
    else:
        depthwise = kind == "depthwise"
        layer = BayesNestedConv2d(8 if depthwise else 3, 8, 3, 2 if depthwise else 1,
                                  depthwise=depthwise, batch_norm=batch_norm,
                                  activation=activation)
    layer = layer.double()
    randomise(layer, 3)
    if layer.bias is not None:
        with torch.no_grad():
            layer.bias.normal_()
    return layer.eval()


@pytest.mark.parametrize("kind", ["conv", "depthwise", "linear"])
@pytest.mark.parametrize("activation,batch_norm,scaled", [
    ("relu", True, True), ("relu", False, True), (None, True, True), (None, False, False),
    ("relu6", True, False)])
def test_fold_equals_layer(kind, activation, batch_norm, scaled):
    layer = _layer(kind, activation, batch_norm)
    if scaled:
        layer.out_scale = torch.rand(8, dtype=torch.float64) + 0.05
    x = torch.randn((2, 12) if kind == "linear" else (2, layer.in_channels, 7, 7),
                    dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w, b = fold_layer(layer, dtype=np.float64)
    if kind == "linear":
        y = F.linear(x, torch.from_numpy(w), torch.from_numpy(b))
    else:
        y = F.conv2d(x, torch.from_numpy(w), torch.from_numpy(b), layer.stride, layer.padding, 1,
                     layer.conv_groups)
    y = {"relu": F.relu, "relu6": F.relu6, None: lambda t: t}[activation](y)
    with torch.no_grad():
        want = layer(x)
    assert (want != 0).any()
    np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)

    # float32: the folded weight is exactly float32(weight_mu) x the recorded fold scale.
    w32, b32 = fold_layer(layer)
    mu = layer.weight_mu.detach().numpy().astype(np.float32)
    assert w32.dtype == b32.dtype == np.float32
    assert np.array_equal(w32, mu * fold_scale(layer).reshape((-1,) + (1,) * (mu.ndim - 1)))


def test_fold_refuses_what_does_not_fold():
    layer = _layer("conv", "relu6", True)
    layer.out_scale = torch.full((8,), 0.5, dtype=torch.float64)
    with pytest.raises(ConfigError, match="relu6"):
        fold_layer(layer)
    layer = _layer("conv", "relu", True)
    layer.out_scale = -torch.ones(8, dtype=torch.float64)
    with pytest.raises(ValueError, match="negative"):
        fold_layer(layer)
    nested = model_for("nested_cnn_small")
    with pytest.raises(ConfigError, match="truncate"):
        fold_layer(nested.fc)
    with pytest.raises(ConfigError, match="truncate"):
        export_point_slice(nested, (1, 8, 8, 1))


def test_export_refuses_bad_arguments():
    small = model_for("nested_cnn_small").truncate(1.0)
    with pytest.raises(ConfigError, match="weights must be"):
        export_point_slice(small, (1, 8, 8, 1), weights="int4")
    with pytest.raises(ConfigError, match="input channels"):
        export_point_slice(small, (1, 8, 8, 3))
    with pytest.raises(ConfigError, match="NHWC|N, H, W, C"):
        export_point_slice(small, (8, 8, 1))
    with pytest.raises(ConfigError, match="inputs flattened"):
        export_point_slice(small, (1, 10, 10, 1))  # fc was built for a 4x4 map


# ---- quantizer -----------------------------------------------------------------------------
@settings(max_examples=40)
@given(seed=st.integers(0, 2**16))
def test_pow2_quantizer_is_exact_on_sums_of_powers_of_two(seed):
    rng = np.random.default_rng(seed)
    channels, size = 6, 20
    # Same-sign sums of up to three distinct powers 2^0..2^-6 (max 1.75 <= 127 * 2^-6), times a
    # per-channel power of two: every value is a multiple of its channel's step.
    powers = 2.0 ** -np.arange(7)
    picks = rng.random((channels, size, 7)) < 3 / 7
    v = np.where(picks, powers, 0).sum(-1) * rng.choice([-1, 1], (channels, size))
    v *= 2.0 ** rng.integers(-10, 4, (channels, 1))
    w = np.moveaxis(v, 0, 1).astype(np.float32)  # channels on axis 1
    qt = quantize_per_channel(w, axis=1, pow2_step=True)
    assert qt.exact and np.array_equal(qt.dequantize(), w)
    assert np.all(np.abs(qt.values.astype(int)) <= 127)
    assert np.array_equal(np.log2(qt.scale), np.round(np.log2(qt.scale)))  # powers of two

    # With a (non power of two) fold scale: int8 x scale == value x fold scale, bit for bit.
    fs = (rng.random(channels) + 0.1).astype(np.float32)
    qt = quantize_per_channel(w, axis=1, pow2_step=True, channel_scale=fs)
    assert qt.exact and np.array_equal(qt.dequantize(), w * fs)

    # Too fine for 127 steps next to the channel's maximum: reported, not silently wrong.
    w2 = w.copy()
    w2[0, 0] = 1.0 * 2.0 ** 20
    w2[1, 0] = 2.0 ** -20
    assert not quantize_per_channel(w2, axis=1, pow2_step=True).exact


def test_plain_quantizer_error_and_range():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 3, 3, 5)).astype(np.float32)
    w[3] = 0  # an all-zero channel gets a harmless step, not a division by zero
    qt = quantize_per_channel(w, axis=0)
    assert not qt.exact
    assert qt.values.dtype == np.int8 and qt.values.min() >= -127 and qt.values.max() <= 127
    peak = np.abs(qt.values.reshape(16, -1)).max(1)
    assert peak.tolist() == [0 if c == 3 else 127 for c in range(16)]
    err = np.abs(qt.dequantize() - w)
    assert (err <= qt.scale.reshape(-1, 1, 1, 1) / 2 * (1 + 1e-6)).all()
    assert not quantize_per_channel(rng.standard_normal((4, 9)), axis=0, pow2_step=True).exact
    with pytest.raises(ConfigError, match="axis"):
        quantize_per_channel(w, axis=4)


# ------------------------------------------------------------------------------ hybrid route
def _op_versions(buf):
    m = schema.ModelT.InitFromPackedBuf(buf, 0)
    codes = {i: c.builtinCode for i, c in enumerate(m.operatorCodes)}
    versions = {i: c.version for i, c in enumerate(m.operatorCodes)}
    return [(codes[op.opcodeIndex], versions[op.opcodeIndex], list(op.inputs))
            for op in m.subgraphs[0].operators], m.subgraphs[0].tensors


def test_hybrid_fully_connected_matches_emulated_kernels():
    """Hybrid FULLY_CONNECTED quantizes each input row to int8 per invoke, multiplies in int32
    with the int8 weights and rescales by input scale x channel scale. Measured here: the
    builtin kernel quantizes symmetrically (scale max|x|/127), XNNPACK (LiteRT's default
    delegate) asymmetrically (scale (max-min)/255 over [min(x,0), max(x,0)], a zero point)."""
    from ai_edge_litert.interpreter import OpResolverType

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    q = quantize_per_channel(w, 0)
    g = GraphBuilder()
    inp = g.add_input("input", x.shape)
    wt = g.add_const(q.values, "w", ChannelQuant(q.scale, 0))
    g.mark_output(g.fully_connected(inp, wt, g.add_const(b, "b"), name="fc"), "logits")
    buf = g.finish()
    ((code, version, _),), _ = _op_versions(buf)
    assert (code, version) == (schema.BuiltinOperator.FULLY_CONNECTED, 12)
    qw = q.values.astype(np.float64)

    sx = np.abs(x).max(1, keepdims=True) / 127
    symmetric = (np.clip(np.round(x / sx), -127, 127) @ qw.T) * sx * q.scale[None] + b
    lo, hi = np.minimum(x.min(1, keepdims=True), 0), np.maximum(x.max(1, keepdims=True), 0)
    sa = (hi - lo) / 255
    zp = np.clip(np.round(-128 - lo / sa), -128, 127)
    asymmetric = ((np.clip(np.round(x / sa) + zp, -128, 127) - zp) @ qw.T) * sa * q.scale[None] + b

    builtin = Interpreter(model_content=buf, num_threads=1, experimental_op_resolver_type=
                          OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for interp, emulated in [(Interpreter(model_content=buf, num_threads=1), asymmetric),
                             (builtin, symmetric)]:
        out = interp.get_signature_runner("serving_default")(input=x)["logits"]
        assert np.abs(out - emulated).max() <= 1e-5 * np.abs(emulated).max()
        assert np.abs(out - (x @ q.dequantize().T + b)).max() > 1e-3  # inputs really quantized


@pytest.mark.parametrize("case", ["nested_cnn_small@28", "nested_mobilenetv2", "nested_vgg"])
def test_hybrid_route_runs_every_model_close_to_the_float_network(case):
    small = model_for(case).truncate(1.0).eval()
    x = inputs(case)
    buf, info = export_point_slice(small, x.shape, weights="hybrid")
    ops, tensors = _op_versions(buf)
    int8 = {i for i, t in enumerate(tensors) if t.type == schema.TensorType.INT8}
    for code, version, ins in ops:
        if code in (schema.BuiltinOperator.CONV_2D, schema.BuiltinOperator.FULLY_CONNECTED):
            assert ins[1] in int8 and version == (5 if code == schema.BuiltinOperator.CONV_2D else 12)
        if code == schema.BuiltinOperator.DEPTHWISE_CONV_2D:
            assert ins[1] not in int8 and version == 1  # depthwise stays on DEQUANTIZE
    routes = {t["route"] for t in info["tensors"]}
    assert "hybrid" in routes and routes <= {"hybrid", "dequantize"}
    # activations are quantized per invoke: close to, not equal to, the float network
    assert 0 < rel_err(run_tflite(buf, x), run_torch(small, x)) < 0.1


# ---- batch -----------------------------------------------------------------------------------


def run_resized(buf, x):
    """One invoke on ``x`` ([N, H, W, C]) after resizing the input to its batch."""
    it = Interpreter(model_content=buf, num_threads=1)
    idx = it.get_input_details()[0]["index"]
    it.resize_tensor_input(idx, list(x.shape))
    it.allocate_tensors()
    it.set_tensor(idx, x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


@pytest.mark.parametrize("case", list(CASES))
def test_an_exported_slice_runs_a_batch_in_one_invoke(case):
    """Written at batch 1 (as the exporter does), resized to N: the N rows equal N single
    invokes; the head reshape's rows stay grouped by sample ([N * S, C])."""
    small = model_for(case).truncate(0.5).eval()
    xs = inputs(case, batch=5, seed=3)
    shape = (1, *CASES[case][1])
    for output_shape in (None, [2, 5]):  # [2, 5]: the 10 logits read as 2 "samples" of 5
        buf, info = export_point_slice(small, shape, weights="dequantize",
                                       output_shape=output_shape)
        rows = 1 if output_shape is None else 2
        assert info["output"]["shape"] == [rows, 10 // rows]
        singles = np.concatenate([run_resized(buf, x[None]) for x in xs])
        batched = run_resized(buf, xs)
        assert batched.shape == (5 * rows, 10 // rows)
        assert np.abs(batched - singles).max() <= 1e-5 * max(1.0, np.abs(singles).max())
        m = schema.ModelT.InitFromPackedBuf(buf, 0)
        sg = m.subgraphs[0]
        assert list(sg.tensors[sg.inputs[0]].shapeSignature) == [-1, *CASES[case][1]]
        assert list(sg.tensors[sg.outputs[0]].shapeSignature) == [-1, 10 // rows]


def test_reshape_infers_one_dimension_and_refuses_the_rest():
    g = GraphBuilder()
    x = g.add_input("input", (1, 4, 4, 2))
    assert g.shape(g.reshape(x, (-1, 32), name="a")) == (1, 32)
    assert g.shape(g.reshape(x, (-1, 8), name="b")) == (4, 8)
    for bad in [(-1, -1), (0, 32), (-2, 16), (-1, 5), (2, 17)]:
        with pytest.raises(ConfigError, match="reshape"):
            g.reshape(x, bad, name=f"bad{bad}")
