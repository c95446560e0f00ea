"""The fx lowering (issue 20, "One lowering and one writer"): any network made of the supported
nodes exports through one lowering and edge_sdk's writer, with no per-model code; the head and
all scopes; the description round-trips; unsupported nodes name themselves."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ai_edge_litert.interpreter import Interpreter
from torch import nn

import exporters.tflite as T
from edge_sdk.errors import ConfigError
from edge_sdk.tflite.graph import Graph
from edge_sdk.tflite.writer import write_tflite
from exporters.weights import with_graph_weights
from exporters.slice import posterior_samples, sliced_heads, stack_heads, with_weights
from exporters.tflite import export_point_slice, lower_point_slice, prepare_weights
from support import randomise
from trainer.layers import BayesNestedConv2d, BayesNestedLinear
from trainer.models import create_model, list_models
from trainer.models.base import NestedModel
from trainer.ordering import DownhillOrdering

torch.set_num_threads(1)
WIDTHS = [0.25, 0.5, 1.0]


class UserNet(NestedModel):
    """Not registered, no emitter anywhere: a nested stem, two branches concatenated (torch.cat),
    a residual-style sum of a ReLU module and F.relu6, average pooling, nn.Flatten, a linear."""

    def __init__(self, mean_pool: bool = False):
        super().__init__()
        u = DownhillOrdering(4, 1, 0.9, 3.0)
        self.stem = BayesNestedConv2d(3, 16, 3, ordering=u)
        self.a = BayesNestedConv2d(16, 8, 1, activation=None).follows(u)
        self.b = BayesNestedConv2d(16, 8, 3, 2, activation=None).follows(u)
        self.up = BayesNestedConv2d(8, 8, 1, 2, padding=0, activation=None)
        self.act = nn.ReLU()
        self.pool = nn.AvgPool2d(2)
        self.drop = nn.Dropout(0.1)
        self.flat = nn.Flatten()
        self.mean_pool = mean_pool
        self.classifier = BayesNestedLinear(16 if mean_pool else 64, 10, activation=None)
        if not mean_pool:
            self.classifier.follows(None, 4)

    def forward(self, x):
        y = self.stem(x)
        y = torch.cat([self.up(self.a(y)), self.b(y)], 1)  # 4x4x16
        y = self.act(y) + F.relu6(y)
        if self.mean_pool:
            return self.classifier(torch.mean(self.drop(y), dim=(2, 3)))
        return self.classifier(self.flat(self.pool(y)))


def user_net(mean_pool=False):
    torch.manual_seed(0)
    m = UserNet(mean_pool).double().eval()
    randomise(m, 2)
    with torch.no_grad():
        for layer in m.bayes_layers():
            if layer.bias is not None:
                layer.bias.normal_()
    return m


def run_tflite(buf, x):
    it = Interpreter(model_content=buf, num_threads=1)
    idx = it.get_input_details()[0]["index"]
    it.resize_tensor_input(idx, list(x.shape))  # the batch is resizable
    it.allocate_tensors()
    it.set_tensor(idx, x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def run_torch(model, x):
    with torch.no_grad():
        return model(torch.from_numpy(x).double().permute(0, 3, 1, 2)).numpy()




def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("mean_pool", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
def test_a_user_network_exports_through_the_generic_lowering(width, mean_pool):
    small = user_net(mean_pool).truncate(width).eval()
    x = np.random.default_rng(1).standard_normal((3, 8, 8, 3)).astype(np.float32)
    ref = run_torch(small, x)
    buf, info = export_point_slice(small, (1, 8, 8, 3), weights="float")
    assert rel(run_tflite(buf, x), ref) <= 1e-5
    assert info["ops"]["CONCATENATION"] == 1 and info["ops"]["ADD"] == 1
    assert info["ops"]["RELU"] == info["ops"]["RELU6"] == 1
    assert info["ops"].get("MEAN" if mean_pool else "AVERAGE_POOL_2D") == 1

    buf, info = export_point_slice(small, (1, 8, 8, 3), weights="dequantize")
    out = run_tflite(buf, x)
    assert rel(out, run_torch(with_graph_weights(small, prepare_weights(small)), x)) <= 1e-5
    assert 0 < rel(out, ref) < 0.1  # the int8 grid is the only other difference


def test_builtin_models_need_no_per_model_code():
    assert not hasattr(T, "_EMITTERS")
    src = open(T.__file__).read() + open(T.lower.__code__.co_filename).read()
    assert not any(f"trainer.models.{m}" in src for m in ("cnn", "vgg", "mobilenetv2"))
    assert set(list_models()) == {"nested_cnn_small", "nested_vgg", "nested_mobilenetv2",
                                  "resnet20_cifar", "mobilenet_v2", "nested_allconv"}


@pytest.mark.parametrize("name,kw,hwc", [
    ("nested_cnn_small", {}, (8, 8, 1)), ("nested_vgg", {"width_mult": 0.25}, (32, 32, 3)),
    ("nested_mobilenetv2", {"width_mult": 0.25}, (32, 32, 3))])
def test_descriptions_of_builtin_models_round_trip_to_the_same_bytes(name, kw, hwc):
    torch.manual_seed(0)
    model = create_model(name, **kw).double().eval()
    randomise(model, 1)
    for width in WIDTHS:
        graph, weights, _ = lower_point_slice(model.truncate(width).eval(), (1, *hwc))
        again = Graph.from_dict(json.loads(json.dumps(graph.to_dict())))
        assert write_tflite(again, weights) == write_tflite(graph, weights)
        assert graph.batch_dim == 0


def test_head_and_all_scopes_export():
    torch.manual_seed(0)
    model = create_model("nested_cnn_small").double().eval()
    randomise(model, 1)
    samples = posterior_samples(model, {}, 3, seed=0)
    x = np.random.default_rng(2).standard_normal((2, 8, 8, 1)).astype(np.float32)
    for width in (0.25, 1.0):
        point = model.truncate(width).eval()
        heads = stack_heads(point, sliced_heads(model, samples, width))
        buf, info = export_point_slice(heads, (1, 8, 8, 1), "float", output_shape=[3, 10])
        want = run_torch(heads, x).reshape(2 * 3, 10)  # [N, S*C] -> [N*S, C]
        assert info["output"]["shape"] == [3, 10] and rel(run_tflite(buf, x), want) <= 1e-5
        for s in samples[:2]:  # all scope: each sample a whole slice of its own
            sliced = with_weights(model, s).truncate(width).eval()
            buf, _ = export_point_slice(sliced, (1, 8, 8, 1), "float")
            assert rel(run_tflite(buf, x), run_torch(sliced, x)) <= 1e-5


class _Bad(nn.Module):
    def __init__(self, what):
        super().__init__()
        self.what = what
        self.conv = BayesNestedConv2d(3, 8, 3)
        self.conv8 = BayesNestedConv2d(8, 8, 3)
        self.act = nn.GELU()
        self.pool = nn.MaxPool2d(3, padding=1, dilation=2)
        self.fc = BayesNestedLinear(8, 10, activation=None)

    def forward(self, x):
        y = self.conv(x)
        if self.what == "function":
            y = torch.tanh(y)
        elif self.what == "module":
            y = self.act(y)
        elif self.what == "padding":
            y = self.pool(y)
        elif self.what == "method":
            return self.fc(y.sum(-1).sum(-1))
        elif self.what == "shared":
            y = self.conv8(self.conv8(y))
        return self.fc(y.mean((2, 3)))


@pytest.mark.parametrize("what,match", [
    ("function", r"fx node 'tanh' \(call_function tanh\): unsupported function tanh"),
    ("module", r"fx node 'act' \(call_module act\): unsupported module GELU"),
    ("padding", r"fx node 'pool' \(call_module pool\): dilation 2 is not supported"),
    ("method", r"fx node 'sum_1' \(call_method sum\): unsupported method sum"),
    ("shared", r"fx node 'conv8_1' \(call_module conv8\): the layer is called twice"),
])
def test_an_unsupported_node_names_itself(what, match):
    with pytest.raises(ConfigError, match=match):
        export_point_slice(_Bad(what).eval(), (1, 6, 6, 3))
