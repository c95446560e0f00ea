"""Issue 35's correctness fixes around ``trainer.nest`` and torchvision: a clean import in a fresh
interpreter, ``torchvision.models:<name>`` as a factory (arguments matched to its signature, the
stem rebuilt for other channel counts), one rule (and message) for a width below a layer's
smallest group in training and export, and refusals at nest time naming the user's module."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from edge_sdk.errors import ConfigError
from trainer.models import create_model
from trainer.nesting import nest

torchvision = pytest.importorskip("torchvision")
ROOT = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)


def test_trainer_nest_imports_cleanly_in_a_fresh_interpreter():
    # the README's example, in a new process: trainer.nest_model <-> trainer.models was a cycle
    # (torchvision left out: importing it takes most of the time, and the cycle is ours)
    code = ("import trainer; from torch import nn; "
            "m = trainer.nest(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), "
            "nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))); "
            "print(type(m).__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "NestedGraphModel"


def test_a_torchvision_factory_gets_the_arguments_its_signature_takes():
    # resnet18(**kwargs) forwards to ResNet(num_classes=...): no in_channels, no input_size;
    # a 1-channel data set rebuilds the stem conv
    model = create_model("torchvision.models:resnet18", num_classes=7, in_channels=1,
                         input_size=32)
    stem = model.get_submodule("body.conv1")
    assert stem.in_channels == 1 and stem.kernel_size == 7 and stem.stride == 2
    with torch.no_grad():
        assert model.eval()(torch.randn(2, 1, 32, 32)).shape == (2, 7)
    with pytest.raises(ConfigError, match=r"calling it with \['depth', 'num_classes'\] failed"):
        create_model("torchvision.models:resnet18", num_classes=7, in_channels=3,
                     input_size=32, depth=3)
    # too small an input is refused when the model is built, not after training
    with pytest.raises(ConfigError, match=r"fails on a \[1, 3, 8, 8\] input"):
        create_model("torchvision.models:squeezenet1_0", num_classes=10, in_channels=3,
                     input_size=8)


def _no_conv_stem(num_classes: int = 10):
    return nn.Sequential(nn.BatchNorm2d(3), nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(),
                         nn.LazyLinear(num_classes))


def test_a_stem_that_cannot_be_rebuilt_names_the_option(monkeypatch):
    import types

    mod = types.ModuleType("issue35_nets")
    mod.net = _no_conv_stem
    monkeypatch.setitem(sys.modules, "issue35_nets", mod)
    with pytest.raises(ConfigError, match=r"in_channels=1, but the factory takes no "
                                          r"in_channels.*not read by one plain Conv2d"):
        create_model("issue35_nets:net", num_classes=10, in_channels=1, input_size=8)


def _small(channels: int = 16):
    return nn.Sequential(nn.Conv2d(3, channels, 3), nn.BatchNorm2d(channels), nn.ReLU(),
                         nn.Conv2d(channels, 32, 3), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def test_a_width_below_a_layers_groups_is_one_rule_naming_the_layer():
    from exporters.export import snapped_widths

    model = nest(_small(), groups=4, frozen=2)  # smallest width 0.5
    with pytest.raises(ConfigError, match=r"layer 'body.3'.*below this layer's 2 frozen of 4 "
                                          r"groups.*smallest width is 0.5") as train_err:
        with model.width(0.25):  # what training and evaluation enter
            pass
    with pytest.raises(ConfigError) as export_err:
        snapped_widths(model, [0.25], log=lambda _: None)
    assert str(export_err.value) == str(train_err.value)


def test_export_cuts_each_unit_at_its_own_group_boundary_as_training_does():
    """(issue 35) a unit of 5 groups next to one of 8: export's "0.25" is training's 0.25 (5
    groups keep 2, 8 groups keep 2), not every unit cut at the coarse unit's 0.4."""
    from exporters.export import snapped_widths

    net = nn.Sequential(nn.Conv2d(3, 20, 3), nn.BatchNorm2d(20), nn.ReLU(),
                        nn.Conv2d(20, 32, 3), nn.BatchNorm2d(32), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    model = nest(net, nest_stem=True)
    assert sorted(u.groups for u in model.orderings()) == [5, 8]
    lines: list[str] = []
    asked = [0.25, 0.3, 0.35, 0.4, 0.5, 1.0]
    got = snapped_widths(model, asked, log=lines.append)
    assert got == [0.25, 0.375, 0.4, 0.5, 1.0]  # 0.35 cuts as 0.3 does: exported once
    assert any("0.35 is the same network as width 0.375" in ln for ln in lines)
    assert any("body.0 2/5" in ln for ln in lines)  # the unit that keeps more is named
    for w in asked:  # the recorded width cuts every unit exactly as the asked one
        (label,) = snapped_widths(model, [w], log=lambda _: None)
        assert label <= min(u.groups_for_width(w) / u.groups for u in model.orderings()) + 1e-12
        assert ([u.groups_for_width(label) for u in model.orderings()]
                == [u.groups_for_width(w) for u in model.orderings()])
    convs = [m for m in model.truncate(0.25).modules() if type(m).__name__ == "NestConv2d"]
    assert [c.out_channels for c in convs] == [8, 8]  # 2 of 5 groups of 4, 2 of 8


def test_two_recorded_widths_sharing_a_key_are_refused():
    """Units of 6 and 100 groups: 0.3 is recorded as 0.3 (30/100), 0.33 as 0.33 (33/100)
    and 0.331 as 1/3 (2/6); the last two differ but both key "0.33" (the store's %.2f)."""
    from exporters.export import snapped_widths
    from trainer.models.base import NestedModel
    from trainer.ordering import DownhillOrdering

    class TwoUnits(NestedModel):
        def __init__(self):
            nn.Module.__init__(self)
            self.a, self.b = DownhillOrdering(6), DownhillOrdering(100)

    model = TwoUnits()
    assert snapped_widths(model, [0.3, 0.33], log=lambda _: None) == [0.3, 0.33]
    with pytest.raises(ConfigError, match=r"widths 0.33 and 0.333333 \(asked 0.331\) are "
                                          r"different networks with the same key '0.33'; drop one"):
        snapped_widths(model, [0.33, 0.331], log=lambda _: None)


def test_a_layer_too_narrow_to_split_stays_full_width_instead_of_raising_the_minimum():
    # 8 channels make 2 groups of 4: nested, the model's smallest width would be 0.5
    # (mnasnet0_5 refused 0.25 in training); it stays full width, 0.25 is reachable
    model = nest(_small(8), nest_stem=True)
    rows = {r["layer"]: r for r in model.nest_summary}
    assert rows["0"]["groups"] == 0 and "only 2 group(s)" in rows["0"]["ordering"]
    assert model.min_width() == 0.125
    with model.width(0.25):
        pass


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3)
        self.blocks = nn.Sequential(torchvision.models.convnext.CNBlock(16, 0.0, 1e-6))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class _Shuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = torchvision.models.shufflenetv2.channel_shuffle(self.stem(x), 2)
        return self.fc(y.mean((2, 3)))


@pytest.mark.parametrize("net,match", [
    (_Attention, r"in module 'blocks.0.block.1'.*permute.*prefix of every layer's channels"),
    (_Shuffle, r"permute.*channel shuffle"),
    (lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                           nn.Flatten(), nn.Linear(32, 10)),
     r"fx node '_2' \(call_module 2\): only global pooling, AdaptiveAvgPool2d\(1\), is exported"),
    (lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True),
                           nn.Flatten(), nn.LazyLinear(10)),
     r"average pooling with ceil_mode=True is not supported .*\(the exporter could not lower"),
])
def test_what_the_exporter_cannot_lower_is_refused_at_nest_time(net, match):
    with pytest.raises(ConfigError, match=match):
        nest(net())
