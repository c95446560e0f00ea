"""``model.weights`` (trainer/models/pretrained.py): a plain state dict loaded before nesting,
the classifier resized to the data's classes, mismatches named."""
import pytest
import torch

from edge_sdk.bundle import InputSpec
from edge_sdk.errors import ConfigError
from trainer.config import load_config
from trainer.models.plain import MobileNetV2
from trainer.models.pretrained import load_plain_weights
from trainer.train import build_model


class _Data:
    def __init__(self, classes=10, size=32):
        self.spec = InputSpec(shape=(1, size, size, 3), dtype="uint8", value_range=(0, 255),
                              mean=(0.0,) * 3, std=(1.0,) * 3,
                              classes=tuple(f"c{i}" for i in range(classes)))


def _trained_plain(classes=10, width=0.25, seed=0):
    """A plain MobileNetV2 whose batch-norm statistics are not the defaults (as after training)."""
    torch.manual_seed(seed)
    net = MobileNetV2(classes, 3, width, cifar=True)
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(8, 3, 32, 32))
    return net.eval()


def _cfg(path, *more):
    return load_config("cifar10", ["model.name=mobilenet_v2", "model.width_mult=0.25",
                                   f"model.weights={path}", *more])


def test_nesting_a_loaded_network_computes_the_same_function(tmp_path):
    net = _trained_plain()
    torch.save(net.state_dict(), tmp_path / "plain.pt")
    model = build_model(_cfg(tmp_path / "plain.pt"), _Data())
    model.eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad(), model.width(1.0, scaled=False), model.weight_mode("mean"):
        got = model(x)
    assert torch.allclose(got, net(x), atol=1e-4)
    assert "weights" not in model.arch["kwargs"]  # the checkpoint holds the result, not the path


def test_the_classifier_is_resized_to_the_datas_classes(tmp_path):
    imagenet_like = _trained_plain(classes=1000)
    torch.save({"state_dict": imagenet_like.state_dict()}, tmp_path / "wrapped.pt")
    net = MobileNetV2(10, 3, 0.25, cifar=True)
    fresh_head = net.classifier[1].weight.detach().clone()
    messages = []
    load_plain_weights(net, str(tmp_path / "wrapped.pt"), log=messages.append)
    given = imagenet_like.state_dict()
    for k, v in net.state_dict().items():
        if not k.startswith("classifier."):
            assert torch.equal(v, given[k]), k
    assert torch.equal(net.classifier[1].weight, fresh_head)
    assert "classifier.1 was resized to (10, 1280)" in messages[0]
    model = build_model(_cfg(tmp_path / "wrapped.pt"), _Data(classes=3))  # through the config
    assert model.arch["kwargs"]["num_classes"] == 3


def test_mismatches_are_named(tmp_path):
    torch.save(_trained_plain(width=0.5).state_dict(), tmp_path / "wider.pt")
    with pytest.raises(ConfigError, match=r"shapes differ \(model vs file\): features\.0\.0\.weight "
                                          r"\(8, 3, 3, 3\) vs \(16, 3, 3, 3\)"):
        build_model(_cfg(tmp_path / "wider.pt"), _Data())
    sd = _trained_plain().state_dict()
    del sd["features.1.conv.0.0.weight"]
    sd["extra.weight"] = torch.zeros(1)
    torch.save(sd, tmp_path / "holes.pt")
    with pytest.raises(ConfigError, match=r"missing from the file: features\.1\.conv\.0\.0\.weight;"
                                          r" not in the model: extra\.weight"):
        build_model(_cfg(tmp_path / "holes.pt"), _Data())


def test_unreadable_files_and_nested_models(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        build_model(_cfg(tmp_path / "nothing.pt"), _Data())
    (tmp_path / "text.pt").write_text("not a checkpoint")
    with pytest.raises(ConfigError, match="cannot read .* as a torch state dict"):
        build_model(_cfg(tmp_path / "text.pt"), _Data())
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    with pytest.raises(ConfigError, match="holds list, not a state dict"):
        build_model(_cfg(tmp_path / "list.pt"), _Data())
    torch.save(_trained_plain().state_dict(), tmp_path / "plain.pt")
    with pytest.raises(ConfigError, match="'nested_cnn_small' is built nested"):
        build_model(load_config("digits", [f"model.weights={tmp_path / 'plain.pt'}"]), _Data())
