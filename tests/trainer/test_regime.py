"""The training regime (trainer/regime.py, the ordering's mask scope and coupling, the decay
groups and the deterministic warm-up): each rule does what its docstring says."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from trainer.config import load_config
from trainer.models import create_model
from trainer.ordering import DownhillOrdering, clear_coupling, coupled_gumbel
from trainer.regime import distillation_loss, regime_step, train_step
from trainer.train import (nested_epoch, noise_epoch, param_groups, regularizer,
                           start_variational_phase)


def _model(frozen: int = 1, groups: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    return create_model("nested_cnn_small", num_classes=10, in_channels=1, input_size=8,
                        groups=groups, frozen=frozen)


def _batch(n: int = 16, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def _step(model, x, y, **kw):
    args = dict(mask_coupling="layer", sandwich=False, distill=True, noise=True,
                regularizer=lambda: torch.zeros(()))
    args.update(kw)
    return train_step(model, model, x, y, **args)


# ---- mask scope ----------------------------------------------------------------------------
@pytest.mark.parametrize("scope,rows", [("batch", 1), ("example", 7)])
def test_mask_scope_sets_one_mask_per_pass_or_per_example(scope, rows):
    u = DownhillOrdering(8, 1)
    u.scope = scope
    u.train()
    m = u.forward_mask(7)
    assert m.shape == (rows, 8)
    assert torch.all(m[:, :-1] >= m[:, 1:]), "masks must stay ordered"


def test_batch_scope_masks_every_example_alike_in_a_forward_pass():
    model = _model()
    model.set_mask_scope("batch")
    model.train()
    seen = []
    layer = model.nested_layers()[0]
    h = layer.register_forward_hook(lambda m, i, o: seen.append((o != 0).flatten(2).any(-1)))
    with model.weight_mode("mean"):
        model(_batch(32)[0])
    h.remove()
    live = seen[0].float()  # [N, C]: channels with any non-zero output per example
    dead_for_all = (live.sum(0) == 0)
    # a channel dropped by the shared mask is dropped for every example
    assert torch.equal(live[:, dead_for_all], torch.zeros_like(live[:, dead_for_all]))


# ---- coupling ------------------------------------------------------------------------------
def test_coupled_units_with_equal_posteriors_draw_equal_widths():
    torch.manual_seed(0)
    a, b = DownhillOrdering(8, 1, init_mubar=0.0), DownhillOrdering(8, 1, init_mubar=0.0)
    for u in (a, b):
        u.scope, u.hard = "example", True
        u.train()
    coupled_gumbel([a, b], 256)
    za, zb = a.forward_mask(256), b.forward_mask(256)
    assert torch.equal(za, zb)
    clear_coupling([a, b])
    assert a.gumbel is None and b.gumbel is None
    za, zb = a.forward_mask(256), b.forward_mask(256)
    assert not torch.equal(za, zb), "independent units must not agree on 256 draws"


def test_coupling_keeps_each_units_marginal_over_widths():
    """Sharing standard Gumbel noise leaves each unit's Downhill posterior unchanged."""
    torch.manual_seed(0)
    a = DownhillOrdering(6, 2, init_mubar=0.0)
    b = DownhillOrdering(6, 2, init_mubar=0.0)
    with torch.no_grad():
        a.mubar.copy_(torch.tensor([1.5, -0.5, 0.3, 2.0]))
    for u in (a, b):
        u.scope, u.hard, u.tau = "example", True, 1.0
        u.train()
    coupled_gumbel([a, b], 40_000)
    z = a.forward_mask(40_000).detach()
    tails = z.sum(-1).long() - a.frozen  # index into beta
    freq = torch.bincount(tails, minlength=a.groups - a.frozen + 1).float() / len(tails)
    assert torch.allclose(freq, a.beta().detach(), atol=0.015), (freq, a.beta())


# ---- sandwich and distillation -------------------------------------------------------------
def test_sandwich_visits_full_sampled_and_smallest_width_every_step():
    model = _model(groups=4)
    model.set_mask_scope("batch")
    model.train()
    units = model.orderings()
    visits = []
    layer = model.nested_layers()[0]
    h = layer.register_forward_hook(
        lambda m, i, o: visits.append((m.ordering.fixed_groups, m.ordering.fixed_scaled)))
    x, y = _batch()
    for _ in range(3):
        visits.clear()
        _step(model, x, y, sandwich=True)
        # full width (0/1 mask, unscaled), the Downhill sample, then the smallest width
        assert visits == [(4, False), (None, True), (1, False)]
    h.remove()
    assert all(u.fixed_groups is None for u in units), "fixed widths must be restored"


def test_full_width_warm_up_step_is_one_full_width_pass_on_the_labels():
    model = _model(groups=4)
    model.train()
    cfg = load_config("digits", ["train.sandwich=true", "train.channels_last=false"])
    visits = []
    layer = model.nested_layers()[0]
    h = layer.register_forward_hook(
        lambda m, i, o: visits.append((m.ordering.fixed_groups, m.ordering.fixed_scaled)))
    x, y = _batch()
    reg = torch.tensor(0.25, requires_grad=True)
    out = regime_step(model, model, x, y, cfg, noise=False, regularizer=lambda: reg * 2,
                      nested=False)
    h.remove()
    assert visits == [(4, False)]
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert reg.grad == 2.0  # the regularizer is in the loss, once
    model.zero_grad(set_to_none=True)
    with model.weight_mode("mean"), model.width(1.0, scaled=False):
        want_loss = F.cross_entropy(model(x), y)
    want_loss.backward()
    assert out.loss == pytest.approx(want_loss.item() + 0.5, rel=1e-6)
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(got[n], p.grad, msg=n)
    assert all(u.fixed_groups is None for u in model.orderings())


@pytest.mark.parametrize("start,epochs,first", [(0.0, 10, 0), (0.33, 6, 2), (0.5, 15, 8)])
def test_nested_epoch(start, epochs, first):
    cfg = load_config("digits", [f"train.nested_start={start}", f"train.epochs={epochs}"])
    assert nested_epoch(cfg) == first


def test_training_runs_the_full_width_alone_before_nested_start(tmp_path, monkeypatch):
    import trainer.train as T

    calls = []

    def spy(*args, nested=True, **kw):
        calls.append(nested)
        return regime_step(*args, nested=nested, **kw)
    monkeypatch.setattr(T, "regime_step", spy)
    cfg = load_config("digits", ["train.epochs=2", "train.nested_start=0.5", "train.threads=1",
                                 "train.eval_widths=[1.0]"])
    T.train(cfg, tmp_path, progress=False, log=lambda *a: None)
    half = len(calls) // 2
    assert len(calls) == 2 * half and half > 0
    assert calls == [False] * half + [True] * half


def test_sandwich_trains_the_configured_narrowest_width():
    """min_width: the narrowest pass is the width asked for (snapped up to a group), and the
    config's default is the smallest served width (eval_widths), not the model's 1/groups."""
    from trainer.config import load_config
    from trainer.regime import sandwich_min_width

    model = _model(groups=8)
    model.set_mask_scope("batch")
    model.train()
    visits = []
    layer = model.nested_layers()[0]
    h = layer.register_forward_hook(lambda m, i, o: visits.append(m.ordering.fixed_groups))
    x, y = _batch()
    _step(model, x, y, sandwich=True, min_width=0.25)
    h.remove()
    assert visits == [8, None, 2]
    cfg = load_config("digits", ["train.eval_widths=[0.5, 1.0]"])
    assert sandwich_min_width(model, cfg) == 0.5
    cfg = load_config("digits", ["train.min_width=0.3"])
    assert sandwich_min_width(model, cfg) == 0.3
    cfg = load_config("digits", ["train.eval_widths=[0.05, 1.0]"])
    assert sandwich_min_width(model, cfg) == model.min_width() == 0.125  # never below the model


def test_uniform_sampled_width_visits_every_middle_boundary_and_nothing_else():
    """sampled_width=uniform: the sampled pass runs one fixed width per step, unscaled, drawn
    from the group boundaries strictly between the narrowest and the full width, all of them."""
    from trainer.regime import uniform_width

    model = _model(groups=8)
    model.set_mask_scope("batch")
    model.train()
    visits = []
    layer = model.nested_layers()[0]
    h = layer.register_forward_hook(
        lambda m, i, o: visits.append((m.ordering.fixed_groups, m.ordering.fixed_scaled)))
    x, y = _batch()
    torch.manual_seed(0)
    middles = []
    for _ in range(40):
        visits.clear()
        _step(model, x, y, sandwich=True, min_width=0.25, sampled_width="uniform")
        assert visits[0] == (8, False) and visits[2] == (2, False)
        groups, scaled = visits[1]
        assert scaled is False and 2 < groups < 8
        middles.append(groups)
    h.remove()
    assert set(middles) == {3, 4, 5, 6, 7}
    torch.manual_seed(5)
    first = [uniform_width(model, 0.25) for _ in range(10)]
    torch.manual_seed(5)
    assert [uniform_width(model, 0.25) for _ in range(10)] == first  # seeded runs repeat
    assert uniform_width(model, 7 / 8) == 7 / 8  # nothing strictly between: the narrowest


def test_sampled_passes_runs_that_many_middle_widths_and_adds_the_regularizer_once():
    """sampled_passes=2 (US-Nets' n = 4): full, two uniform middle widths, narrowest; the
    regularizer is charged once per step however many passes run."""
    model = _model(groups=8)
    model.set_mask_scope("batch")
    model.train()
    visits = []
    h = model.nested_layers()[0].register_forward_hook(
        lambda m, i, o: visits.append(m.ordering.fixed_groups))
    x, y = _batch()
    leaf = torch.zeros((), requires_grad=True)  # d(total loss)/d(reg) = passes charged with it
    torch.manual_seed(0)
    _step(model, x, y, sandwich=True, min_width=0.25, sampled_width="uniform",
          sampled_passes=2, regularizer=lambda: leaf * 1.0)
    h.remove()
    assert len(visits) == 4 and visits[0] == 8 and visits[3] == 2
    assert all(2 < g < 8 for g in visits[1:3])
    assert float(leaf.grad) == 1.0
    for sandwich in (False, True):  # without the sandwich the first sampled pass carries it
        leaf.grad = None
        _step(model, x, y, sandwich=sandwich, min_width=0.25, sampled_width="uniform",
              sampled_passes=3, regularizer=lambda: leaf * 1.0)
        assert float(leaf.grad) == 1.0


def test_subnet_weight_scales_the_narrower_passes_gradients_linearly():
    """subnet_weight w: the step's gradient is g_full + w * g_narrower (w = 0: the full width's
    alone), so grad(1) - grad(0) = 2 (grad(0.5) - grad(0))."""
    base = _model(groups=8)
    x, y = _batch()

    def grads_of(model):
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    grads = {}
    for w in (0.0, 0.5, 1.0):
        model = copy.deepcopy(base)
        model.set_mask_scope("batch")
        model.train()
        torch.manual_seed(3)  # the same middle width for every w
        _step(model, x, y, sandwich=True, min_width=0.25, sampled_width="uniform",
              subnet_weight=w, noise=False)
        grads[w] = grads_of(model)
    assert grads[0.0].keys() == grads[0.5].keys() == grads[1.0].keys()
    moved = max(float((grads[1.0][n] - grads[0.0][n]).abs().max()) for n in grads[0.0])
    assert moved > 1e-4  # the narrower passes do contribute
    for n in grads[0.0]:
        torch.testing.assert_close(grads[0.5][n] - grads[0.0][n],
                                   (grads[1.0][n] - grads[0.0][n]) / 2, rtol=1e-4, atol=1e-6)
    full_only = copy.deepcopy(base)
    full_only.train()
    with full_only.width(1.0, scaled=False), full_only.weight_mode("mean"):
        F.cross_entropy(full_only(x), y).backward()
    ref = grads_of(full_only)
    for n, g in ref.items():
        torch.testing.assert_close(grads[0.0][n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_without_sandwich_a_step_is_one_sampled_pass():
    model = _model()
    model.train()
    calls = []
    h = model.nested_layers()[0].register_forward_hook(lambda *a: calls.append(1))
    _step(model, *_batch())
    h.remove()
    assert len(calls) == 1


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_distillation_gradient_does_not_flow_into_the_teacher():
    """With every width the same network (frozen = groups) and no weight noise, the sampled and
    smallest passes equal the teacher: against a *detached* teacher their loss has zero gradient
    (p_student - p_teacher = 0), so the step's gradient is exactly the full pass's cross-entropy
    gradient. A teacher that let gradient through would add the entropy's gradient."""
    model = _model(frozen=4, groups=4)
    model.train()
    x, y = _batch()
    model.zero_grad()
    _step(model, x, y, sandwich=True, distill=True, noise=False)
    got = _grads(model)
    model.zero_grad()
    with model.weight_mode("mean"), model.width(1.0, scaled=False):
        F.cross_entropy(model(x), y).backward()
    want = _grads(model)
    assert torch.allclose(got, want, atol=1e-6)

    # the same check fails for a teacher that is not detached (the test can tell them apart)
    model.zero_grad()
    with model.weight_mode("mean"):
        logits = model(x)
        (F.cross_entropy(logits, y)
         + distillation_loss(model(x), torch.softmax(logits, -1))).backward()
    assert not torch.allclose(_grads(model), want, atol=1e-6)


def test_distillation_loss_is_cross_entropy_to_soft_targets():
    s = torch.tensor([[2.0, 0.0, -1.0]])
    t = torch.tensor([[0.0, 1.0, 0.0]])
    assert math.isclose(distillation_loss(s, t).item(), F.cross_entropy(s, torch.tensor([1])).item(),
                        rel_tol=1e-6)


def test_no_distill_trains_every_pass_on_the_labels():
    model = _model(frozen=4, groups=4)
    model.train()
    x, y = _batch()
    model.zero_grad()
    _step(model, x, y, sandwich=True, distill=False, noise=False)
    got = _grads(model)
    model.zero_grad()
    with model.weight_mode("mean"), model.width(1.0, scaled=False):
        (3 * F.cross_entropy(model(x), y)).backward()
    assert torch.allclose(got, _grads(model), atol=1e-5)


# ---- weight noise ----------------------------------------------------------------------------
def test_noise_off_runs_posterior_means_only():
    model = _model()
    model.train()
    x, y = _batch()
    model.set_mask_scope("batch")
    for u in model.orderings():
        with torch.no_grad():
            u.mubar.fill_(30.0)  # always the full width: the only randomness left is weight noise
    a = _step(model, x, y, noise=False).logits
    b = _step(model, x, y, noise=False).logits
    assert torch.equal(a, b)
    c = _step(model, x, y, noise=True).logits
    assert not torch.equal(a, c)


def test_variational_phase_resets_sigma_from_the_means():
    model = _model()
    cfg = load_config("digits", ["bayes.log_alpha_init=-6"])
    with torch.no_grad():
        for layer in model.bayes_layers():
            layer.weight_mu.mul_(3.0)
    start_variational_phase(model, cfg)
    for layer in model.bayes_layers():
        want = (layer.weight_mu.abs() * math.exp(-3.0)).clamp_min(1e-5)
        assert torch.allclose(layer.weight_sigma, want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("start,epochs,first", [(0.0, 10, 0), (0.67, 6, 4), (1.0, 5, 5)])
def test_noise_epoch(start, epochs, first):
    cfg = load_config("digits", [f"bayes.noise_start={start}", f"train.epochs={epochs}"])
    assert noise_epoch(cfg) == first


def test_warm_up_regularizer_has_no_weight_kl():
    model = _model()
    cfg = load_config("digits", ["bayes.kappa=1.0"])
    full = regularizer(model, cfg, 100)
    from trainer.train import ordering_regularizer
    assert ordering_regularizer(model, cfg, 100) < full


# ---- weight decay groups ---------------------------------------------------------------------
def test_decay_scope_weights_decays_only_weight_means():
    model = _model()
    cfg = load_config("digits", ["train.decay_scope=weights", "train.weight_decay=0.1",
                                 "train.optimizer=sgd", "train.momentum=0", "train.lr=1.0"])
    groups = param_groups(model, cfg)
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names and all(n.endswith("weight_mu") for n in names)
    # behaviour: one SGD step with zero gradients changes exactly the decayed parameters
    from trainer.train import _optimizer
    opt = _optimizer(model, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        changed = not torch.equal(before[n], p.detach())
        assert changed == (n in names) or before[n].abs().sum() == 0, n


def test_decay_scope_all_decays_everything():
    model = _model()
    cfg = load_config("digits", ["train.decay_scope=all", "train.weight_decay=0.1"])
    (group,) = param_groups(model, cfg)
    assert len(group["params"]) == len(list(model.parameters()))
    assert group["weight_decay"] == 0.1


# ---- memory layout (train.channels_last) -----------------------------------------------------
@pytest.mark.parametrize("enabled,noise", [(True, False), (False, False), (True, True)])
def test_channels_last_runs_nhwc_activations_with_the_same_gradients(enabled, noise):
    """regime_step hands the convolutions NHWC images when train.channels_last is on and the
    pass runs the posterior means (the standard layout when off, or with weight noise, where
    NHWC is slower), and the step's gradients are the standard layout's."""
    from trainer.regime import regime_step

    cfg = load_config("digits", ["train.sandwich=true", "train.sampled_width=uniform",
                                 "ordering.mask_scope=batch", f"train.channels_last={enabled}"])
    g = torch.Generator().manual_seed(1)
    # RGB: a one-channel (N, 1, H, W) batch is contiguous in both layouts, so convolutions
    # keep NCHW for it (the flag does nothing for grey images)
    x, y = torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)
    grads, layouts = [], []
    for reference in (True, False):
        torch.manual_seed(0)
        model = create_model("nested_cnn_small", num_classes=10, in_channels=3, input_size=8,
                             groups=4, frozen=1)
        model.set_mask_scope("batch")
        model.train()
        seen = []
        h = model.nested_layers()[1].register_forward_pre_hook(
            lambda m, i: seen.append(i[0].is_contiguous(memory_format=torch.channels_last)
                                     and not i[0].is_contiguous()))
        torch.manual_seed(3)
        if reference:  # the same step on the standard layout
            _step(model, x, y, sandwich=True, sampled_width="uniform", noise=noise,
                  mask_coupling=cfg.ordering.coupling, min_width=0.25)
        else:
            regime_step(model, model, x, y, cfg, noise=noise, regularizer=lambda: torch.zeros(()))
        h.remove()
        layouts.append(seen)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert layouts[0] and not any(layouts[0])
    nhwc = enabled and not noise
    assert all(layouts[1]) if nhwc else not any(layouts[1])
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6, msg=n)


def test_channels_last_leaves_vectors_alone():
    from trainer.device import as_channels_last
    x = torch.randn(5, 64)
    assert as_channels_last(x) is x
    img = torch.randn(2, 3, 4, 4)
    assert as_channels_last(img, enabled=False) is img
    nhwc = as_channels_last(img)
    assert torch.equal(nhwc, img) and not nhwc.is_contiguous()
    assert nhwc.is_contiguous(memory_format=torch.channels_last)


def test_without_the_narrow_pass_the_sandwich_runs_full_and_sampled_widths_only():
    model = _model(groups=8)
    model.set_mask_scope("batch")
    model.train()
    visits = []
    h = model.nested_layers()[0].register_forward_hook(
        lambda m, i, o: visits.append(m.ordering.fixed_groups))
    x, y = _batch()
    torch.manual_seed(0)
    _step(model, x, y, sandwich=True, min_width=0.25, sampled_width="uniform",
          narrow_pass=False)
    h.remove()
    assert len(visits) == 2 and visits[0] == 8 and 2 < visits[1] < 8
