"""Issue 35: a tiny representative of every layer kind torchvision's CNN families add, through
nest -> truncate -> float TFLite -> interpreter, equal to torch's truncation at every width
(1e-5 relative), and the freshly nested network at width 1.0 equal to the network it was made
from. The kinds are torchvision's own blocks where they exist (MobileNetV3's InvertedResidual,
EfficientNet's MBConv), so what passes here is what the full models are made of.
benchmarks/any_cnn.py runs the full models (not in CI)."""
import numpy as np
import pytest
import torch
from torch import nn

from exporters.tflite import export_point_slice, lower_point_slice
from support import randomise
from test_lowering import rel, run_tflite, run_torch
from trainer.nesting import nest

torchvision = pytest.importorskip("torchvision")
from torchvision.models import efficientnet as tv_eff  # noqa: E402
from torchvision.models import mobilenetv3 as tv_mnv3  # noqa: E402
from torchvision.ops.misc import Conv2dNormActivation  # noqa: E402

torch.set_num_threads(1)
WIDTHS = [0.25, 0.5, 1.0]


def _head(channels: int) -> list:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)]


def resnet_stem():
    """ResNet's stem: 7x7 stride-2 conv (padding 3) and a padded max pool (3, 2, 1)."""
    return nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), nn.Conv2d(32, 32, 3, padding=1),
                         nn.BatchNorm2d(32), nn.ReLU(), *_head(32))


def ceil_pools():
    """SqueezeNet / GoogLeNet's ceil_mode max pools (odd sizes: the ceil adds a window), a
    padded ceil-mode pool and Inception's padded average pool (padded zeros counted)."""
    return nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
                         nn.Conv2d(32, 32, 1), nn.BatchNorm2d(32), nn.Hardswish(),
                         nn.MaxPool2d(3, 1, 1, ceil_mode=True), nn.AvgPool2d(3, 1, 1),
                         nn.Conv2d(32, 32, 1), nn.ReLU(), nn.MaxPool2d(2, 2, ceil_mode=True),
                         *_head(32))


def mnv3_blocks():
    """MobileNetV3: Hardswish stem, an SE block with ReLU and one with Hardswish (hardsigmoid
    gates), a residual block, a Hardswish hidden linear before the classifier."""
    cfg = tv_mnv3.InvertedResidualConfig
    norm = nn.BatchNorm2d
    return nn.Sequential(
        Conv2dNormActivation(3, 16, 3, 2, norm_layer=norm, activation_layer=nn.Hardswish),
        tv_mnv3.InvertedResidual(cfg(16, 3, 64, 24, True, "RE", 1, 1, 1.0), norm),
        tv_mnv3.InvertedResidual(cfg(24, 5, 96, 24, True, "HS", 1, 1, 1.0), norm),
        tv_mnv3.InvertedResidual(cfg(24, 3, 64, 32, False, "HS", 2, 1, 1.0), norm),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 64), nn.Hardswish(),
        nn.Dropout(0.2), nn.Linear(64, 10))


def mnv3_large_start():
    """MobileNetV3-Large's first blocks: the Hardswish stem summed with an expand-ratio-1
    block (depthwise on the stem's output, projection, residual add), then a Hardswish SE
    block."""
    cfg = tv_mnv3.InvertedResidualConfig
    norm = nn.BatchNorm2d
    return nn.Sequential(
        Conv2dNormActivation(3, 16, 3, 2, norm_layer=norm, activation_layer=nn.Hardswish),
        tv_mnv3.InvertedResidual(cfg(16, 3, 16, 16, False, "RE", 1, 1, 1.0), norm),
        tv_mnv3.InvertedResidual(cfg(16, 3, 64, 24, True, "HS", 2, 1, 1.0), norm),
        tv_mnv3.InvertedResidual(cfg(24, 3, 72, 24, False, "RE", 1, 1, 1.0), norm), *_head(24))


def effnet_blocks():
    """EfficientNet: SiLU everywhere, MBConv with sigmoid squeeze-excitation (4 and 6 squeeze
    channels: 6 is not a multiple of 4 and stays full width) and stochastic depth."""
    mb = tv_eff.MBConvConfig
    norm = nn.BatchNorm2d
    return nn.Sequential(
        Conv2dNormActivation(3, 16, 3, 1, norm_layer=norm, activation_layer=nn.SiLU),
        tv_eff.MBConv(mb(4, 3, 1, 16, 16, 1), 0.2, norm),
        tv_eff.MBConv(mb(6, 3, 2, 16, 24, 1), 0.2, norm),
        tv_eff.MBConv(mb(6, 5, 1, 24, 24, 1), 0.2, norm), *_head(24))


def grouped_blocks():
    """ResNeXt / RegNet: 1x1 -> grouped 3x3 (8 groups of 4, a stride-2 one) -> 1x1, residual;
    nested by whole groups (the unit's groups divide the conv's)."""
    tv = torchvision.models.resnet
    down = nn.Sequential(nn.Conv2d(16, 64, 1, 2, bias=False), nn.BatchNorm2d(64))
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         tv.Bottleneck(16, 16, 2, down, groups=8, base_width=16),
                         tv.Bottleneck(64, 16, 1, None, groups=8, base_width=16), *_head(64))


def regnet_blocks():
    """RegNet's own blocks: 32 channels in 2 conv groups of 16 (too coarse for whole groups:
    the unit's 8 groups cut inside a conv group, the last kept conv group partial), then
    RegNet-Y's squeeze-excitation block with 4 conv groups of 8 (whole groups)."""
    rg = torchvision.models.regnet
    norm, act = nn.BatchNorm2d, nn.ReLU
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        rg.ResBottleneckBlock(16, 32, 2, norm, act, 16, 1.0, None),
        rg.ResBottleneckBlock(32, 32, 1, norm, act, 8, 1.0, 0.25), *_head(32))


def inception_like():
    """Inception v3: factorised 1x7 / 7x1 and 1x3 / 3x1 kernels (non-square padding) in
    concatenated branches, a padded average pool branch."""
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            B = torchvision.models.inception.BasicConv2d
            self.b1 = B(16, 16, kernel_size=1)
            self.b7 = nn.Sequential(B(16, 16, kernel_size=1),
                                    B(16, 16, kernel_size=(1, 7), padding=(0, 3)),
                                    B(16, 24, kernel_size=(7, 1), padding=(3, 0)))
            self.b3 = B(16, 16, kernel_size=(3, 1), padding=(1, 0), stride=(2, 1))
            self.pool = B(16, 8, kernel_size=1)

        def forward(self, x):
            pooled = self.pool(torch.nn.functional.avg_pool2d(x, 3, 1, 1))
            return torch.cat([self.b1(x), self.b7(x), pooled], 1), self.b3(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torchvision.models.inception.BasicConv2d(3, 16, kernel_size=3)
            self.mixed = Mixed()
            self.fc = nn.Linear(48 + 16, 10)

        def forward(self, x):
            a, b = self.mixed(self.stem(x))
            return self.fc(torch.cat([a.mean((2, 3)), b.mean((2, 3))], 1))
    return Net()


class UNetLike(nn.Module):
    """A small U-Net-style classifier: down, nearest x2 upsampling concatenated with the skip,
    bilinear upsampling (align_corners False and True)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec = nn.Sequential(nn.Conv2d(48, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.fc = nn.Linear(16 + 32, 10)

    def forward(self, x):
        e = self.enc(x)
        d = self.down(e)
        y = self.dec(torch.cat([self.up(d), e], 1))
        z = torch.nn.functional.interpolate(d, scale_factor=2, mode="bilinear")
        z = torch.nn.functional.interpolate(z, scale_factor=(1, 2), mode="bilinear",
                                            align_corners=True)
        return self.fc(torch.cat([y.mean((2, 3)), z.mean((2, 3))], 1))


class DenseLike(nn.Module):
    """DenseNet: torchvision's dense block (pre-activation BN -> ReLU -> conv over the growing
    concatenation) and transition, a final standalone BN + ReLU."""

    def __init__(self):
        super().__init__()
        dn = torchvision.models.densenet
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            dn._DenseBlock(2, 16, 4, 8, 0.0), dn._Transition(32, 16),
            dn._DenseBlock(2, 16, 4, 8, 0.0), nn.BatchNorm2d(32))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        y = torch.nn.functional.relu(self.features(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, (1, 1)), 1))


CASES = {"resnet_stem": (resnet_stem, 17), "ceil_pools": (ceil_pools, 15),
         "mnv3": (mnv3_blocks, 16), "effnet": (effnet_blocks, 12),
         "grouped": (grouped_blocks, 10), "regnet": (regnet_blocks, 9),
         "inception": (inception_like, 11),
         "unet": (UNetLike, 8), "densenet": (DenseLike, 8)}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    make, side = CASES[request.param]
    torch.manual_seed(0)
    source = make().double().eval()
    randomise(source, 3)  # BN statistics far from their initial values
    model = nest(source).double().eval()
    return request.param, source, model, side


def test_a_fresh_nest_at_width_one_is_the_source_network(case):
    _, source, _, side = case
    model = nest(source).double().eval()  # its own: the fixture's is randomised below
    x = torch.randn(4, 3, side, side, dtype=torch.float64)
    with torch.no_grad(), model.width(1.0):  # default arguments (scaled)
        # nest's layers hold float32 copies of the source's weights: float32 rounding only
        assert rel(model(x).numpy(), source(x).numpy()) <= 1e-6


@pytest.mark.parametrize("width", WIDTHS)
def test_every_width_exports_equal_to_the_torch_truncation(case, width):
    name, _, model, side = case
    model.set_rescale(True)  # the trained regime: keep probabilities fold into the slice
    randomise(model, 4)
    small = model.truncate(width).eval()
    x = np.random.default_rng(1).standard_normal((3, side, side, 3)).astype(np.float32)
    buf, _ = export_point_slice(small, (1, side, side, 3), weights="float")
    assert rel(run_tflite(buf, x), run_torch(small, x)) <= 1e-5
    if width < 1:
        assert any(m.ordering is not None for m in model.bayes_layers())
        graph, _, _ = lower_point_slice(small, (1, side, side, 3), "float")
        full, _, _ = lower_point_slice(model.truncate(1.0).eval(), (1, side, side, 3), "float")
        from edge_sdk.tflite.graph import graph_stats
        assert graph_stats(graph)["macs"] < graph_stats(full)["macs"]


def test_the_gate_follows_its_block_and_is_not_masked():
    model = nest(mnv3_blocks())
    dw = model.get_submodule("body.2.block.1.0")
    fc2 = model.get_submodule("body.2.block.2.fc2")
    assert dw.ordering is not None and fc2.ordering is dw.ordering  # SE follows its block
    assert not fc2.apply_mask and dw.apply_mask and dw.forward_fold  # hardswish: folds forward
    rows = {r["layer"]: r["ordering"] for r in model.nest_summary}
    assert "squeeze-excitation gate" in rows["2.block.2.fc2"]
    small = model.truncate(0.25)
    assert small.get_submodule("body.2.block.2.fc2").out_channels == dw.out_channels // 4


def test_a_grouped_conv_too_coarse_for_whole_groups_is_cut_inside_a_group():
    model = nest(regnet_blocks())
    fa = model.get_submodule("body.3.f.a.0")
    fb = model.get_submodule("body.3.f.b.0")
    assert fb.ordering is fa.ordering and fa.ordering.groups == 8  # not 2 (its conv groups)
    assert fa.apply_mask and fb.apply_mask  # the input masked too: the partial group is exact
    rows = {r["layer"]: r["ordering"] for r in model.nest_summary}
    assert "partial" in rows["3.f.b.0"]
    small = model.truncate(0.25)
    assert small.get_submodule("body.3.f.b.0").out_channels == 8  # half of one conv group
    whole = model.get_submodule("body.4.f.b.0")  # 4 conv groups of 8: whole groups
    assert "whole groups" in rows["4.f.b.0"] and whole.ordering.groups == 4


def _masked_minus_truncated(model, width: float, x: torch.Tensor) -> float:
    """The full-width network under a sampled mask that happens to keep ``width``'s groups
    (scaled by the keep probabilities, as a fixed width is) against the truncated slice: what
    training trains against what the slice runs."""
    units = model.orderings()
    for u in units:
        u.forward_mask = lambda batch, u=u: (u.mask(width).to(x) *
                                             u.rescale_probability().to(x)).unsqueeze(0)
    try:
        with torch.no_grad():
            masked = model(x).numpy()
    finally:
        for u in units:
            del u.forward_mask
    with torch.no_grad():
        return rel(model.truncate(width).eval()(x).numpy(), masked)


def _trained_like(make, **nest_kwargs):
    """A float64 nested network of ``make()`` whose weights, BN statistics and sampled-mask
    rescale are all away from their initial values (what the masked-vs-truncated checks
    need)."""
    torch.manual_seed(0)
    source = make().double().eval()
    randomise(source, 3)
    model = nest(source, **nest_kwargs).double().eval()
    randomise(model, 4)
    model.set_rescale(True)
    return model


def test_a_partial_conv_group_in_training_computes_what_its_truncation_runs():
    # a sampled mask runs the full-width conv on masked inputs: the partial group's cut-off
    # inputs must be zeros there (its input is masked too), or training would not train what
    # the slice runs (measured without that mask: 6e-3)
    model = _trained_like(regnet_blocks)
    x = torch.randn(3, 3, 9, 9, dtype=torch.float64)
    for w in WIDTHS:
        assert _masked_minus_truncated(model, w, x) <= 1e-12


@pytest.mark.parametrize("width", WIDTHS)
def test_stage_mode_folds_a_hardswish_stream_forwards_through_its_adds(width):
    # MobileNetV3: the Hardswish stem is summed in the first block; with residual='stage' the
    # stream is nested and every summand's rescale folds forwards past the add (s h + s p)
    model = _trained_like(mnv3_large_start, residual="stage", nest_stem=True)
    stem = model.get_submodule("body.0.0")
    proj = model.get_submodule("body.1.block.1.0")  # the first block's projection (summed)
    assert stem.ordering is not None and stem.ordering is proj.ordering
    assert stem.forward_fold and proj.forward_fold
    x = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    assert _masked_minus_truncated(model, width, x) <= 1e-12
    small = model.truncate(width).eval()
    xn = np.random.default_rng(1).standard_normal((3, 16, 16, 3)).astype(np.float32)
    buf, _ = export_point_slice(small, (1, 16, 16, 3), weights="float")
    assert rel(run_tflite(buf, xn), run_torch(small, xn)) <= 1e-5


def test_a_pre_activation_norm_follows_its_segments_and_masks_again():
    # DenseNet: the norm over the concatenation keeps each branch's kept prefix (an index set)
    # and zeroes the dropped channels again after itself (bn(0) != 0), so the full-width
    # network under a sampled mask computes what the truncated slice runs
    model = _trained_like(DenseLike)
    rows = {r["layer"]: r["ordering"] for r in model.nest_summary}
    assert rows["features.4.conv"].startswith("unit")  # the transition, read by norms
    assert "follows its input's segments" in rows["features.5.denselayer2.norm1"]
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    for w in WIDTHS:
        assert _masked_minus_truncated(model, w, x) <= 1e-12
    name = "body.features.5.denselayer2.norm1"
    assert model.truncate(0.5).get_submodule(name).out_channels < \
        model.get_submodule(name).out_channels
