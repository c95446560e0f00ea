"""nest() -> slice -> TFLite (issue 20's tests): an untrained ResNet-20 (both residual modes),
torchvision's mobilenet_v2 at 32x32 (its ReLU6 kept, the rescale folded forward) and a
user-style nn.Sequential CNN export through the one lowering at widths 0.25/0.5/1 and the
interpreter computes what torch computes."""
import numpy as np
import pytest
import torch
from torch import nn

from exporters.tflite import export_point_slice, lower_point_slice, prepare_weights
from support import randomise
from exporters.weights import with_graph_weights
from test_lowering import rel, run_tflite, run_torch
from trainer.models.plain import ResNet20Cifar
from trainer.nesting import nest

torchvision = pytest.importorskip("torchvision")
torch.set_num_threads(1)
WIDTHS = [0.25, 0.5, 1.0]


CASES = {
    "resnet20-inner": (lambda: nest(ResNet20Cifar()), (32, 32, 3)),
    "resnet20-stage": (lambda: nest(ResNet20Cifar(), residual="stage", nest_stem=True),
                       (32, 32, 3)),
    "resnet20-pad-at-end": (lambda: nest(ResNet20Cifar(shortcut="A-end")), (32, 32, 3)),
    "mobilenet_v2": (lambda: nest(torchvision.models.mobilenet_v2(num_classes=10)), (32, 32, 3)),
    "sequential": (lambda: nest(_user_cnn()), (8, 8, 1)),
}


def _user_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(64, 48, 1), nn.ReLU(), nn.Flatten(),
        nn.Linear(48 * 16, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10))


@pytest.fixture(scope="module", params=list(CASES))
def nested(request):
    make, hwc = CASES[request.param]
    torch.manual_seed(0)
    model = make().double().eval()
    randomise(model, 1)  # keep probabilities and BN statistics far from their initial values
    return request.param, model, hwc


@pytest.mark.parametrize("width", WIDTHS)
def test_nested_user_networks_export_equal_to_torch(nested, width):
    name, model, hwc = nested
    small = model.truncate(width).eval()
    x = np.random.default_rng(1).standard_normal((2, *hwc)).astype(np.float32)
    ref = run_torch(small, x)
    buf, _ = export_point_slice(small, (1, *hwc), weights="float")
    assert rel(run_tflite(buf, x), ref) <= 1e-5
    buf, _ = export_point_slice(small, (1, *hwc), weights="dequantize")
    out = run_tflite(buf, x)
    assert rel(out, run_torch(with_graph_weights(small, prepare_weights(small)), x)) <= 1e-5
    assert 0 < rel(out, ref) < 0.2  # the int8 grid is the only other difference
    # the slice is really narrower: every nested layer kept its share of channels
    # (a width inside a group rounds up to the group boundary)
    kept = {n: m.ordering.groups_for_width(width) * (m.out_channels // m.ordering.groups)
            for n, m in model.named_modules() if getattr(m, "ordering", None) is not None}
    cut = dict(small.named_modules())
    assert kept and all(cut[n].out_channels == k for n, k in kept.items())
    assert width == 1 or any(k < model.get_submodule(n).out_channels for n, k in kept.items())


def test_mobilenet_v2_exports_with_its_relu6():
    torch.manual_seed(0)
    model = nest(torchvision.models.mobilenet_v2(num_classes=10)).double().eval()
    randomise(model, 2)
    small = model.truncate(0.5).eval()
    graph, _, _ = lower_point_slice(small, (1, 32, 32, 3), weights="float")
    acts = [o.options.get("activation") for o in graph.ops if o.op.endswith("CONV_2D")]
    # stem, 17 depthwise, 16 expands and the last 1x1: ReLU6 fused into the conv (35 convs +
    # 17 depthwise in all; the 17 projections are linear bottlenecks)
    assert acts.count("relu6") == 35 and acts.count(None) == 17
    # the masked ReLU6 layers keep no backwards scale: it sits in their consumers' weights
    dws = [m for m in small.bayes_layers() if getattr(m, "depthwise", False)]
    assert len(dws) == 17 and all(m.out_scale is None for m in dws)
