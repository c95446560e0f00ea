"""``model.name: module:factory`` (issue 20, CLI and config): a user's factory of a plain nn.Module
is called with the data's shape and model.kwargs, nested by trainer.nest, trained by
``edge-sdk train --set model.name=...``, and its checkpoint reloads (importing the factory only)."""
import numpy as np
import pytest
import torch

import trainer
from edge_sdk.cli import main as cli
from edge_sdk.errors import ConfigError
from exporters.slice import posterior_samples, sliced_heads, stack_heads
from trainer import checkpoint as ckpt_io
from trainer.models import create_model
from trainer.nest_model import NestedGraphModel
from trainer.nesting import nest

torch.set_num_threads(1)


def test_trainer_nest_is_the_function():
    assert trainer.nest is nest


def test_train_a_factory_model_from_the_cli_and_reload_its_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli.main(["train", "--config", "digits", "--out", str(out), "--no-progress",
                   "--set", "model.name=user_nets:small_cnn", "--set", "train.epochs=1",
                   "--set", "model.kwargs={hidden: 32, nest: {residual: stage}}"])
    assert rc == 0, capsys.readouterr().err
    ckpt = ckpt_io.load_checkpoint(out / "checkpoint.pt")  # weights_only: no pickled code
    assert ckpt["arch"] == {"name": "user_nets:small_cnn",
                            "kwargs": {**ckpt["arch"]["kwargs"], "hidden": 32,
                                       "nest": {"residual": "stage"}}}
    assert ckpt["arch"]["kwargs"]["input_size"] == 8 and ckpt["arch"]["kwargs"]["in_channels"] == 1
    model = ckpt_io.model_from_checkpoint(ckpt)
    assert isinstance(model, NestedGraphModel)
    assert model.get_submodule("body.8").out_features == 32  # hidden from model.kwargs
    assert model.get_submodule("body.10").ordering is None  # the classifier
    assert len(model.orderings()) == 2  # conv 2 and the hidden linear (the stem is not nested)
    x = torch.randn(4, 1, 8, 8)
    again = ckpt_io.model_from_checkpoint(ckpt)
    with torch.no_grad():
        assert torch.equal(model(x), again(x))
    # the head scope finds the user network's classifier by its recorded name
    samples = posterior_samples(model, ckpt, 2, seed=0)
    heads = stack_heads(model.truncate(0.5).eval(), sliced_heads(model, samples, 0.5))
    assert heads.get_submodule("body.10").out_features == 20


@pytest.mark.parametrize("name,kwargs,match", [
    ("no_such_pkg.nets:f", {}, r"cannot import 'no_such_pkg.nets'"),
    ("user_nets:missing", {}, r"user_nets has no callable 'missing'"),
    ("user_nets:not_a_module", {}, r"returned str, expected a torch nn.Module"),
    ("user_nets:small_cnn", {"depth": 3}, r"takes no argument\(s\) \['depth'\]"),
    ("user_nets:small_cnn", {"width_mult": 0.5}, r"width_mult=0.5"),
    ("user_nets:small_cnn", {"nest": {"colour": 1}}, r"model.kwargs.nest must be a mapping"),
    ("user nets:x", {}, r"expected a registered name or 'module:factory'"),
])
def test_factory_errors_name_what_is_wrong(name, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        create_model(name, num_classes=10, in_channels=1, input_size=8, **kwargs)


def test_factory_gets_the_data_shape_and_nest_gets_the_ordering_options():
    model = create_model("user_nets:small_cnn", num_classes=7, in_channels=3, input_size=16,
                         groups=2, frozen=1, prior_pi=0.8, hidden=24)
    assert model.get_submodule("body.0").in_channels == 3
    assert model.get_submodule("body.8").in_features == 32 * 8 * 8
    assert model.get_submodule("body.10").out_features == 7
    assert {u.groups for u in model.orderings()} == {2}
    assert np.allclose(torch.sigmoid(model.orderings()[0].prior_logit).numpy(), 0.8)
