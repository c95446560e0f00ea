"""Nested layers and registered models: truncation == masking, shapes, KL weighting, errors."""
import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from edge_sdk.errors import ConfigError
from trainer.layers import BayesNestedConv2d, BayesNestedLinear, gaussian_kl, log_uniform_kl
from trainer.models import create_model, list_models
from trainer.ordering import DownhillOrdering
from support import randomise

# Larger architectures at a reduced width multiplier keep the suite fast; the code paths
# (nesting, truncation, residuals, depthwise) are the same.
CASES = {
    "nested_cnn_small": ({}, (1, 8, 8), 10),
    "nested_cnn_small@28": ({"input_size": 28}, (1, 28, 28), 5),
    "nested_vgg": ({"width_mult": 0.25}, (3, 32, 32), 3),
    "nested_vgg@gap": ({"width_mult": 0.25, "hidden": 0}, (3, 32, 32), 3),
    "nested_mobilenetv2": ({"width_mult": 0.5}, (3, 32, 32), 3),
    # issue 20's registry: nest(...) of plain definitions
    "resnet20_cifar": ({}, (3, 32, 32), 3),
    "resnet20_cifar@stage": ({"residual": "stage", "nest_stem": True}, (3, 32, 32), 3),
    "mobilenet_v2": ({"width_mult": 0.75}, (3, 32, 32), 3),
    "nested_allconv": ({"width_mult": 0.5}, (3, 32, 32), 3),
    "nested_allconv@stem": ({"width_mult": 0.5, "nest_stem": False}, (3, 32, 32), 3),
}


def test_every_registered_model_is_covered():
    assert {k.split("@")[0] for k in CASES} == set(list_models())


def test_vgg_without_hidden_layer_reads_the_features_directly():
    # hidden=0: the classifier takes the last conv's (1x1) features: no hidden dense layer
    with_fc = create_model("nested_vgg", width_mult=0.25)
    gap = create_model("nested_vgg", width_mult=0.25, hidden=0)
    last_conv = [m for m in gap.features if isinstance(m, BayesNestedConv2d)][-1]
    assert isinstance(gap.fc, torch.nn.Identity)
    assert gap.classifier.weight_mu.shape == (10, last_conv.weight_mu.shape[0])
    assert len(gap.orderings()) == len(with_fc.orderings()) - 1
    with pytest.raises(ConfigError, match="hidden must be >= 0"):
        create_model("nested_vgg", hidden=-1)


_models = {}


def model_for(case):
    if case not in _models:
        kw, _, _ = CASES[case]
        torch.manual_seed(0)
        _models[case] = create_model(case.split("@")[0], **kw).double().eval()
    return _models[case]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("width", [0.25, 0.5, 1.0])
def test_truncated_equals_masked(case, width):
    kw, shape, examples = CASES[case]
    model = model_for(case)

    @settings(max_examples=examples)
    @given(seed=st.integers(0, 2**16))
    def check(seed):
        randomise(model, seed)
        x = torch.randn((3,) + shape, generator=torch.Generator().manual_seed(seed),
                        dtype=torch.float64)
        with torch.no_grad(), model.width(width):
            masked = model(x)
        small = model.truncate(width).eval()
        with torch.no_grad():
            sliced = small(x)
        assert torch.isfinite(masked).all()
        assert (masked - sliced).abs().max() <= 1e-9 * max(1.0, masked.abs().max().item())
        # and the slice really is smaller (except at full width)
        n_small = sum(p.numel() for p in small.parameters())
        n_full = sum(p.numel() for p in model.parameters() if p is not None)
        assert n_small < n_full if width < 1 else n_small <= n_full

    check()


@pytest.mark.parametrize("case", list(CASES))
def test_forward_backward_shapes_no_nan(case):
    kw, shape, _ = CASES[case]
    torch.manual_seed(0)
    model = create_model(case.split("@")[0], **kw).train()
    x = torch.randn((4,) + shape)
    out = model(x)
    assert out.shape == (4, 10)
    loss = out.logsumexp(1).mean() + 1e-4 * (model.weight_kl() + model.ordering_kl())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(p.grad).all(), name
    assert all(u.mubar.grad.abs().sum() > 0 for u in model.orderings() if u.mubar.numel())


def test_dropped_channels_are_exactly_zero_for_the_next_layer():
    """A sampled Downhill mask zeroes the dropped channels (they are still computed: the
    straight-through gradient needs them)."""
    torch.manual_seed(0)
    model = create_model("nested_cnn_small").train()
    randomise(model, 1)
    first = model.features[0]
    unit = first.ordering
    with torch.no_grad():
        unit.mubar.fill_(-6.0)  # keep probability ~0.0025 per group: almost surely 1 group
        y = first(torch.randn(5, 1, 8, 8))
    size = first.out_channels // unit.groups
    assert y.shape[1] == first.out_channels
    assert y[:, size:].abs().max() == 0
    assert y[:, :size].abs().max() > 0


@pytest.mark.parametrize("name", ["nested_cnn_small", "nested_mobilenetv2"])
@pytest.mark.parametrize("training", [False, True])
def test_fixed_width_computes_only_the_kept_channels(name, training):
    """Under ``model.width(w)`` a nested layer computes only its kept prefix, and the network's
    output (and, in training, its batch-norm statistics) equals the masked full computation."""
    torch.manual_seed(0)
    kw = {"input_size": 8, "in_channels": 1} if name == "nested_cnn_small" else \
        {"input_size": 32, "in_channels": 3, "width_mult": 0.5}
    model = create_model(name, **kw)
    randomise(model, 1)
    model.train(training)
    twin = copy.deepcopy(model)
    x = torch.randn(6, kw["in_channels"], kw["input_size"], kw["input_size"])
    first = model.nested_layers()[0]
    shapes = []
    hook = first.register_forward_hook(lambda m, i, o: shapes.append(o.shape[1]))
    with torch.no_grad(), model.width(0.25, scaled=not training), model.weight_mode("mean"):
        out = model(x)
    hook.remove()
    k = first.ordering.groups_for_width(0.25) * (first.out_channels // first.ordering.groups)
    assert shapes == [k] and k < first.out_channels
    # the masked computation: every layer full width, dropped channels multiplied by 0
    for layer in twin.nested_layers():
        layer.kept_outputs = lambda: None
    with torch.no_grad(), twin.width(0.25, scaled=not training), twin.weight_mode("mean"):
        ref = twin(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    if training:  # the kept channels' running statistics moved exactly as the masked run's
        for a, b in zip(model.nested_layers(), twin.nested_layers()):
            if a.bn is None:
                continue
            kk = a.ordering.groups_for_width(0.25) * (a.out_channels // a.ordering.groups)
            torch.testing.assert_close(a.bn.running_mean[:kk], b.bn.running_mean[:kk])
            torch.testing.assert_close(a.bn.running_var[:kk], b.bn.running_var[:kk])


def test_weight_kl_is_weighted_by_keep_probability():
    unit = DownhillOrdering(4, 1)
    layer = BayesNestedLinear(6, 16, ordering=unit)
    with torch.no_grad():
        unit.mubar.copy_(torch.tensor([2.0, -1.0, 0.5]))
    per_out = log_uniform_kl(layer.weight_mu, layer.weight_sigma).sum(1)
    expect = (per_out.view(4, 4).sum(1) * unit.keep_probability()).sum()
    assert torch.allclose(layer.weight_kl(), expect)
    assert layer.weight_kl() < per_out.sum()  # dropping-prone groups cost less


def test_log_uniform_kl_minimum_is_zero_near_alpha_two():
    mu = torch.ones(2001)
    log_alpha = torch.linspace(-6, 6, 2001)
    kl = log_uniform_kl(mu, torch.exp(0.5 * log_alpha))
    assert kl.min().item() == pytest.approx(0.0, abs=1e-4)
    assert 0.0 < log_alpha[kl.argmin()].item() < 1.5  # not pushed to alpha -> infinity
    assert kl[0] > kl.min() and kl[-1] > kl.min()


def test_gaussian_kl_zero_at_prior():
    kl = gaussian_kl(0.3)(torch.zeros(4), torch.full((4,), 0.3))
    assert torch.allclose(kl, torch.zeros(4), atol=1e-7)


def test_weight_kl_hook_switches_off():
    model = create_model("nested_cnn_small")
    assert model.weight_kl() > 0
    model.set_weight_kl(None)
    assert model.weight_kl() == 0


def test_weight_modes():
    torch.manual_seed(0)
    layer = BayesNestedConv2d(3, 8, ordering=None, batch_norm=False)
    x = torch.randn(2, 3, 5, 5)
    layer.mode = "mean"
    assert torch.equal(layer(x), layer(x))
    for mode in ("sample", "sample_weights"):
        layer.mode = mode
        assert not torch.equal(layer(x), layer(x))
    layer.mode = "bogus"
    with pytest.raises(ConfigError, match="mode"):
        layer(x)


def test_errors_name_what_is_wrong():
    with pytest.raises(ConfigError, match="unknown model 'nope'.*nested_cnn_small"):
        create_model("nope")
    with pytest.raises(ConfigError, match="unknown argument"):
        create_model("nested_cnn_small", colour=True)
    with pytest.raises(ConfigError, match="multiple of 4"):
        BayesNestedConv2d(3, 24, ordering=DownhillOrdering(4, 1))  # group size 6
    with pytest.raises(ConfigError, match="relu"):
        BayesNestedConv2d(3, 16, ordering=DownhillOrdering(4, 1), activation="relu6")
    model = create_model("nested_cnn_small", groups=8, frozen=2)
    with pytest.raises(ConfigError, match="smallest width"):
        with model.width(0.2):
            pass
    assert model.min_width() == 0.25


# ---- model.init ------------------------------------------------------------------------------
def _built(init: str, name: str = "nested_cnn_small", seed: int = 0):
    from trainer.config import load_config
    from trainer.data import load_data
    from trainer.train import build_model

    cfg = load_config("digits", [f"model.init={init}", f"model.name={name}"])
    torch.manual_seed(seed)
    return build_model(cfg, load_data(cfg.data))


def test_torch_init_draws_the_stock_layers_uniform_weights_and_biases():
    model = _built("torch")
    for layer in model.bayes_layers():
        fan_in = layer.weight_mu[0].numel()
        bound = 1.0 / fan_in ** 0.5
        w = layer.weight_mu.detach()
        assert w.abs().max() <= bound + 1e-7, "U(+-1/sqrt(fan_in))"
        if w.numel() >= 1000:  # the uniform's std, bound / sqrt(3), not kaiming_normal's
            assert w.std().item() == pytest.approx(bound / 3 ** 0.5, rel=0.1)
        if layer.bias is not None:
            assert layer.bias.abs().max() <= bound and layer.bias.abs().max() > 0
        # sigma is re-derived from the new means (alpha = exp(log_alpha_init))
        want = (w.abs() * torch.exp(torch.tensor(-2.0))).clamp_min(1e-5)
        torch.testing.assert_close(layer.weight_sigma.detach(), want, rtol=1e-4, atol=1e-7)


def test_kaiming_normal_init_has_the_he_std():
    model = _built("kaiming_normal")
    big = [layer for layer in model.bayes_layers() if layer.weight_mu.numel() >= 1000]
    assert big
    for layer in big:
        fan_in = layer.weight_mu[0].numel()
        assert layer.weight_mu.std().item() == pytest.approx((2 / fan_in) ** 0.5, rel=0.1)


def test_init_leaves_a_factory_models_own_weights_alone():
    a = _built("torch", name="user_nets:small_cnn")
    b = _built("kaiming_normal", name="user_nets:small_cnn")
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(p, q, msg=n)


def test_allconv_slices_have_the_plain_networks_channels_and_macs():
    # nest_stem (the default): a width-w slice is the plain all-conv network at width w, which
    # is what issue 32's references are compared at
    from trainer.models.plain import AllConvNet, allconv_channels

    def macs(net):
        total = [0]
        hooks = [m.register_forward_hook(lambda l, i, o: total.__setitem__(
            0, total[0] + o[0].numel() * l.weight[0].numel()))
            for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
        net.eval()(torch.zeros(1, 3, 32, 32))
        for h in hooks:
            h.remove()
        return total[0]

    assert allconv_channels(1.0) == (32, 64, 128)
    assert allconv_channels(0.25) == (8, 16, 32)
    assert allconv_channels(0.3, 8) == (16, 24, 40)  # rounded up, never down
    full = AllConvNet()
    assert macs(full) == 38_634_752  # issue 32: ~38.6 M MACs, the VGG11-at-0.5 budget
    nested = create_model("nested_allconv").eval()
    for w in (0.25, 0.5, 1.0):
        sliced = nested.truncate(w)
        convs = [m for m in sliced.modules() if isinstance(m, BayesNestedConv2d)]
        plain = AllConvNet(10, 3, allconv_channels(w))
        assert [c.weight_mu.shape[0] for c in convs] == [
            m.out_channels for m in plain.modules() if isinstance(m, torch.nn.Conv2d)]
