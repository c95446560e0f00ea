"""trainer.nest (issue 20, "Bring your own network"): a user's plain CNN becomes a nested Bayesian
network under BN³'s rules; each rule is checked here, export equality in
tests/exporters/test_nest_export.py."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.errors import ConfigError
from support import randomise
from user_nets import ConcatNet
from trainer.models.plain import ResNet20Cifar
from trainer.nesting import nest, pick_groups

torchvision = pytest.importorskip("torchvision")
torch.set_num_threads(1)
WIDTHS = [0.25, 0.5, 1.0]


def assert_truncation_is_masking(model, x):
    """At every width, the truncated copy computes what the masked full model computes."""
    for w in WIDTHS:
        with torch.no_grad(), model.width(w):
            masked = model(x)
        with torch.no_grad():
            cut = model.truncate(w).eval()(x)
        assert float((masked - cut).abs().max() / masked.abs().max()) <= 1e-10


def user_cnn(classes=10):
    """A user-style nn.Sequential CNN for 8x8 grey inputs: biases before BN and without BN."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(64, 48, 1), nn.ReLU(), nn.Flatten(),
        nn.Linear(48 * 16, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, classes))


def pretrained(module, seed=0):
    """Random BN affine and running statistics and conv biases: a "trained" module."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            elif isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
    return module.double().eval()


def L(body, name):
    return body.get_submodule(name)


NETS = {
    "sequential": (user_cnn, (1, 8, 8)),
    "resnet20": (ResNet20Cifar, (3, 32, 32)),
    "mobilenet_v2": (lambda: torchvision.models.mobilenet_v2(num_classes=10), (3, 32, 32)),
}


@pytest.mark.parametrize("name", NETS)
def test_pretrained_weights_survive_as_posterior_means(name):
    make, shape = NETS[name]
    torch.manual_seed(0)
    plain = pretrained(make())
    model = nest(plain).double().eval()
    x = torch.randn(3, *shape, dtype=torch.float64)
    # the rescale at 1: the plain 0/1 mask at full width (ordering off), mean weights
    with torch.no_grad(), model.width(1.0, scaled=False), model.weight_mode("mean"):
        got = model(x)
    with torch.no_grad():
        want = plain(x)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-5
    # ... and the rescale is really there otherwise: nested layers exist and change the output
    randomise(model, 3)
    with torch.no_grad(), model.weight_mode("mean"):
        assert float((model(x) - want).abs().max()) > 1e-3


@pytest.mark.parametrize("name", NETS)
@pytest.mark.parametrize("residual", ["inner", "stage"])
def test_truncation_computes_what_the_masked_network_computes(name, residual):
    make, shape = NETS[name]
    torch.manual_seed(0)
    kw = {"residual": residual, "nest_stem": residual == "stage"}
    model = nest(make(), **kw).double().eval()
    randomise(model, 1)
    x = torch.randn(2, *shape, dtype=torch.float64)
    assert_truncation_is_masking(model, x)


def test_stage_mode_shares_one_unit_per_stream_and_truncates_summed_layers_identically():
    model = nest(ResNet20Cifar(), residual="stage", nest_stem=True)
    body = model.body
    stage2 = [L(body, "layers.3.conv2"), L(body, "layers.3.shortcut.0"), L(body, "layers.4.conv2"),
              L(body, "layers.5.conv2")]
    assert all(m.ordering is stage2[0].ordering for m in stage2)
    # the nested stem joins stage 1's stream
    assert body.conv1.ordering is L(body, "layers.0.conv2").ordering
    assert L(body, "layers.3.conv1").ordering is not stage2[0].ordering  # inside a block: its own
    for w in WIDTHS:
        cut = model.truncate(w).body
        outs = {L(cut, "layers.3.conv2").out_channels, L(cut, "layers.3.shortcut.0").out_channels,
                L(cut, "layers.4.conv2").out_channels, L(cut, "layers.5.conv2").out_channels}
        assert outs == {int(32 * w)}
    # without a nested stem, stage 1's stream carries the stem: it stays full width
    model = nest(ResNet20Cifar(), residual="stage")
    assert L(model.body, "layers.0.conv2").ordering is None
    assert L(model.body, "layers.3.conv2").ordering is not None


def test_a_pad_at_end_shortcut_stays_aligned_by_staying_full_width():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    for residual in ("inner", "stage"):
        model = nest(ResNet20Cifar(shortcut="A-end"), residual=residual, nest_stem=True)
        model = model.double().eval()
        randomise(model, 4)
        for i in (3, 6):  # the blocks whose shortcut pads
            assert L(model.body, f"layers.{i}.conv2").ordering is None
        assert L(model.body, "layers.3.conv1").ordering is not None  # inside a block: nested
        why = {r["layer"]: r["ordering"] for r in model.nest_summary}["layers.4.conv2"]
        assert "pad at the end" in why or "residual='inner'" in why
        assert_truncation_is_masking(model, x)


def test_inner_mode_keeps_the_residual_stream_full_width():
    model = nest(ResNet20Cifar())
    body = model.body
    for i in range(9):
        assert L(body, f"layers.{i}.conv1").ordering is not None
        assert L(body, f"layers.{i}.conv2").ordering is None
    assert L(body, "layers.3.shortcut.0").ordering is None and body.fc.ordering is None
    assert body.conv1.ordering is None  # the stem (nest_stem=False)
    assert nest(ResNet20Cifar(), nest_stem=True).body.conv1.ordering is None  # on the stream


def test_groups_hold_multiples_of_four_and_are_listed_in_the_summary(capsys):
    model = nest(ResNet20Cifar(), verbose=True)
    printed = capsys.readouterr().out
    assert "layers.0.conv1" in printed and "groups" in printed
    groups = {r["layer"]: r["groups"] for r in model.nest_summary}
    assert groups["layers.0.conv1"] == 4 and groups["layers.3.conv1"] == 8  # 16 ch: 16 // 4
    assert groups["layers.0.conv2"] == 0  # full width (residual stream)
    mb = nest(torchvision.models.mobilenet_v2(num_classes=10))
    g = {r["layer"]: r["groups"] for r in mb.nest_summary}
    # 144 channels: 8 groups would hold 18 (not 4k), 6 would keep 2/6 at width 0.25: 12 groups
    assert g["features.3.conv.0.0"] == 12
    for layer in mb.nested_layers():
        assert (layer.out_channels // layer.ordering.groups) % 4 == 0
    # under the cap while one is a multiple of 4; else the count cutting 1/4 and 1/2 closest
    assert [pick_groups(c, 8) for c in (16, 24, 144, 64, 12, 40, 104)] == [4, 6, 12, 8, 3, 10, 26]
    assert pick_groups(24, 2) == 2 and pick_groups(144, 6) == 6  # a cap not a multiple of 4


def test_a_grouped_conv_unit_keeps_whole_conv_groups_closest_to_the_width():
    # RegNet-X's 400 channels in 25 conv groups of 16: one ordering group per conv group
    # (width 0.25 keeps 7/25), not 5 (2/5); ResNeXt's 32 conv groups: 8 under the cap
    assert pick_groups(400, 8, divides=[25]) == 25 and pick_groups(2048, 8, divides=[32]) == 8
    assert pick_groups(64, 8, divides=[4]) == 4
    for c, conv_groups in ((400, 25), (208, 26), (440, 55), (160, 10)):
        g = pick_groups(c, 8, divides=[conv_groups])
        assert conv_groups % g == 0 and (c // g) % 4 == 0
        assert math.ceil(0.25 * g) / g < 0.32
    # 6 channels cannot form groups of 4: that layer stays full width (issue 35: efficientnet's
    # 6-channel squeeze), the model still nests
    six = {r["layer"]: r for r in nest(_Six()).nest_summary}
    assert six["l1"]["groups"] == 0 and "not a multiple of 4" in six["l1"]["ordering"]
    assert six["l0"]["groups"] == 0 or six["l0"]["groups"] >= 2


class _Six(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = nn.Conv2d(1, 8, 3)
        self.l1 = nn.Conv2d(8, 6, 3)
        self.fc = nn.Linear(6, 2)

    def forward(self, x):
        return self.fc(F.relu(self.l1(F.relu(self.l0(x)))).mean((2, 3)))


def test_depthwise_follows_its_input_unit_and_relu6_folds_forward():
    mb = nest(torchvision.models.mobilenet_v2(num_classes=10))
    expand, dw, project = (L(mb.body, f"features.3.conv.{i}") for i in ("0.0", "1.0", "2"))
    assert dw.depthwise and dw.ordering is expand.ordering
    assert not expand.apply_mask and dw.apply_mask  # masked once, after the depthwise
    assert dw.activation == "relu6" and dw.forward_fold
    assert project.ordering is None and project.in_segments[0][2]  # folds dw's rescale
    cut = mb.truncate(0.5)
    assert L(cut.body, "features.3.conv.1.0").out_scale is None  # not folded backwards





def test_a_concatenation_keeps_each_branch_unit_and_offset():
    torch.manual_seed(0)
    model = nest(ConcatNet(), groups=4).double().eval()
    randomise(model, 2)
    segs = model.body.mix.in_segments
    assert [(s[1], s[2]) for s in segs] == [(16, True), (32, False)]
    assert segs[0][0] is model.body.a.ordering and segs[1][0] is model.body.b.ordering
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    for w in WIDTHS:
        with torch.no_grad(), model.width(w):
            masked = model(x)
        cut = model.truncate(w).eval()
        assert cut.body.mix.in_channels == int(48 * w)
        with torch.no_grad():
            assert float((masked - cut(x)).abs().max() / masked.abs().max()) <= 1e-10


def test_the_training_loop_runs_a_nested_user_network():
    """Sampled masks in train mode and a fixed narrow width (the sandwich pass, which computes
    only kept channels, concatenated segments included) both train."""
    torch.manual_seed(0)
    for make in (ConcatNet, ResNet20Cifar):
        model = nest(make(), groups=4).train()
        x = torch.randn(4, 3, 8, 8)
        loss = model(x).logsumexp(1).mean() + model.weight_kl() * 1e-4 + model.ordering_kl()
        with model.width(0.25, scaled=False):
            loss = loss + model(x).logsumexp(1).mean()
        loss.backward()
        assert all(u.mubar.grad is not None for u in model.orderings())


class _ReluSixAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        # the add is passed (stage mode: every summand folds forwards, s y + s z = s (y + z)),
        # the relu6 after it is not
        y = F.relu(self.a(x))
        y = F.relu6(y + F.relu6(self.b(y)))
        return self.fc(y.mean((2, 3)))


class _Unsupported(nn.Module):
    def __init__(self, what):
        super().__init__()
        self.what = what
        self.conv = nn.Conv2d(3, 16, 3)
        self.bn = nn.BatchNorm2d(16, track_running_stats=False)  # (pre-activation BN nests)
        self.group = nn.Conv2d(16, 32, 3, groups=4)  # in != out: cannot follow its input
        self.group2 = nn.Conv2d(16, 16, 1)
        self.fc = nn.Linear(16 * 36, 10)

    def forward(self, x):
        y = self.conv(x)
        if self.what == "tanh":
            y = torch.tanh(y)
        elif self.what == "bn":
            y = self.bn(F.relu(y))
        elif self.what == "grouped":
            return self.fc(self.group(y).mean((2, 3)).repeat(1, 18))
        elif self.what == "shared":
            y = self.group2(self.group2(F.relu(y)))
        return self.fc(y.view(y.size(0), -1))


@pytest.mark.parametrize("net,kw,match", [
    (lambda: _Unsupported("tanh"), {}, r"fx node 'tanh' \(call_function tanh\): "
                                       "unsupported function tanh"),
    (lambda: _Unsupported("view"), {}, r"fx node 'size' \(call_method size\): size: reading or "
                                     "rearranging a tensor's shape"),
    (lambda: _Unsupported("bn"), {}, r"fx node 'bn' .*without running statistics"),
    (lambda: _Unsupported("grouped"), {}, r"fx node 'group' .*grouped conv with groups=4 \(16 -> 32\).*in == out"),
    (lambda: _Unsupported("shared"), {}, r"fx node 'group2_1' .*called twice"),
    # a node inside a submodule names the user's module path
    (lambda: ResNet20Cifar(shortcut="A"), {}, r"fx node 'pad' \(call_function pad\) in module "
                                              r"'layers.3': pads channels on both sides.*option A"),
    (_ReluSixAdd, {"residual": "stage", "nest_stem": True},
     r"fx node 'relu6_1' .*rescale of the masked relu6 layer 'b' cannot pass a "
     r"non-homogeneous activation"),
])
def test_an_unsupported_op_or_unmet_rule_names_its_node(net, kw, match):
    with pytest.raises(ConfigError, match=match):
        nest(net(), **kw)


def test_registry_variants_are_nest_of_plain_definitions():
    from trainer.checkpoint import model_from_checkpoint
    from trainer.models import create_model
    from trainer.models.plain import MobileNetV2

    # the plain MobileNetV2 is torchvision's, module for module: its weights load and agree
    tv = torchvision.models.mobilenet_v2(num_classes=10).eval()
    plain = MobileNetV2(10).eval()
    plain.load_state_dict(tv.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(plain(x), tv(x))
    for name, kw in (("resnet20_cifar", {"residual": "stage", "nest_stem": True}),
                     ("mobilenet_v2", {"width_mult": 0.75})):
        model = create_model(name, **kw).eval()
        assert model.nested_layers() and model.arch == {"name": name, "kwargs": kw}
        again = model_from_checkpoint({"arch": model.arch, "state_dict": model.state_dict()})
        x = torch.randn(2, 3, 32, 32)
        again.set_rescale(False)  # a checkpoint without a config keeps the paper's rescale
        with torch.no_grad():
            assert torch.equal(model(x), again(x))
