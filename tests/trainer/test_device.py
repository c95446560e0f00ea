"""train.device: resolution (auto / cpu / cuda / mps), the DDP backend, device-independent
checkpoints, and no tensor made on the default device by our code on the training paths."""
import copy
import inspect
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import exporters
import trainer
from edge_sdk.errors import ConfigError
from trainer.config import load_config
from trainer.device import ddp_backend, model_device, resolve_device

QUIET = lambda *a, **k: None  # noqa: E731
OURS = tuple(str(Path(p.__file__).resolve().parent) for p in (trainer, exporters))
TORCH = str(Path(torch.__file__).resolve().parent)
DATALOADER = str(Path(TORCH) / "utils" / "data")
FACTORIES = {torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor, torch.as_tensor,
             torch.arange, torch.linspace, torch.rand, torch.randn, torch.randint, torch.eye,
             torch.randperm}


# ---- resolution ---------------------------------------------------------------------------
def test_cpu_is_cpu():
    assert resolve_device("cpu") == torch.device("cpu")


def test_auto_takes_cuda_when_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cuda", 1)


def test_auto_falls_back_to_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


def test_unavailable_cuda_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"train.device is cuda.*is_available\(\) is False"):
        resolve_device("cuda")


def test_unavailable_mps_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="train.device is mps"):
        resolve_device("mps")


def test_unknown_device_names_the_choices():
    with pytest.raises(ConfigError, match="auto, cpu, cuda, mps"):
        resolve_device("tpu")
    with pytest.raises(ConfigError, match="train.device"):
        load_config("digits", ["train.device=gpu"])


def test_ddp_backend_follows_the_device():
    assert ddp_backend(torch.device("cuda", 0)) == "nccl"
    assert ddp_backend(torch.device("cpu")) == "gloo"


# ---- no tensor on the default device from our code ---------------------------------------
class DefaultDeviceWatch(TorchFunctionMode):
    """Records factory calls without ``device=`` whose caller (the first frame outside torch)
    is in our packages. torch's own internals are not ours to judge."""

    def __init__(self):
        super().__init__()
        self.hits: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            frame = inspect.currentframe().f_back
            while frame is not None and frame.f_code.co_filename.startswith(TORCH):
                if frame.f_code.co_filename.startswith(DATALOADER):
                    # DataLoader's sampler and collate build host batches by design; our
                    # code moves each batch to the model's device after the loader yields it.
                    return func(*args, **kwargs)
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(OURS):
                self.hits.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {func.__name__}")
        return func(*args, **kwargs)


def test_the_watch_catches_a_factory_call_without_device():
    """The detector itself: code living in trainer/ that calls torch.tensor(...) is flagged,
    the same call with device= is not."""
    ns = {"torch": torch}
    src = "def bad():\n    return torch.tensor(1.0)\ndef good():\n    return torch.tensor(1.0, device='cpu')\n"
    exec(compile(src, str(Path(trainer.__file__).parent / "regime.py"), "exec"), ns)
    with DefaultDeviceWatch() as watch:
        ns["good"]()
    assert watch.hits == [], "\n".join(watch.hits)
    with DefaultDeviceWatch() as watch:
        ns["bad"]()
    assert len(watch.hits) == 1 and "regime.py" in watch.hits[0]


@pytest.fixture(scope="module")
def tiny():
    from trainer.data import load_data, subset
    from trainer.train import build_model

    cfg = load_config("digits", ["train.device=cpu", "train.batch_size=32",
                                 "ordering.mask_scope=batch", "ordering.coupling=network",
                                 "train.sandwich=true", "train.eval_widths=[0.5,1.0]",
                                 "data.calib_samples=64"])
    data = load_data(cfg.data)
    import numpy as np
    from dataclasses import replace
    data = replace(data, train=subset(data.train, np.arange(96)),
                   val=subset(data.val, np.arange(64)), test=subset(data.test, np.arange(64)))
    torch.manual_seed(0)
    return cfg, data, build_model(cfg, data)


def test_one_training_step_makes_no_tensor_on_the_default_device(tiny):
    import copy

    from trainer.regime import regime_step
    from trainer.train import regularizer

    cfg, data, model = tiny
    model = copy.deepcopy(model).to(resolve_device(cfg.train.device))
    model.set_mask_scope(cfg.ordering.mask_scope)
    model.train()
    x, y = data.train.x[:32], data.train.y[:32]
    with DefaultDeviceWatch() as watch:
        regime_step(model, model, x, y, cfg, noise=True,
                    regularizer=lambda: regularizer(model, cfg, len(data.train)))
    assert watch.hits == [], "\n".join(watch.hits)


def test_bn_recollection_makes_no_tensor_on_the_default_device(tiny):
    from exporters.slice import make_slice
    from trainer.evaluate import batches

    cfg, data, model = tiny
    calib = batches(data.train, 64, 0, batch=32)
    with DefaultDeviceWatch() as watch:
        make_slice(model, 0.5, calib, device=torch.device("cpu"))
    assert watch.hits == [], "\n".join(watch.hits)


def test_one_pwfn_round_makes_no_tensor_on_the_default_device(tiny):
    import copy

    from trainer.config import PWFNConfig
    from trainer.quantize.pwfn import fix_weights_

    cfg, data, model = tiny
    pcfg = PWFNConfig(schedule=[0.5, 1.0], epochs_per_round=1, samples=1)
    with DefaultDeviceWatch() as watch:
        fix_weights_(copy.deepcopy(model), pcfg, data, cfg, progress=False, log=QUIET)
    assert watch.hits == [], "\n".join(watch.hits)


def test_one_sqs_fine_tuning_run_makes_no_tensor_on_the_default_device(tiny):
    import copy

    from trainer.config import SQSConfig
    from trainer.quantize.sqs import sqs_

    cfg, data, model = tiny
    with DefaultDeviceWatch() as watch:
        sqs_(copy.deepcopy(model), SQSConfig(epochs=1, samples=1, bits=2), data, cfg,
             progress=False, log=QUIET)
    assert watch.hits == [], "\n".join(watch.hits)


# ---- checkpoints ----------------------------------------------------------------------------
class CpuCopies(TorchFunctionMode):
    """Records the ids of tensors passed through ``Tensor.cpu`` (directly or via ``detach``)."""

    def __init__(self):
        super().__init__()
        self.ids: set[int] = set()
        self._origin: dict[int, int] = {}
        self._keep: list = []  # keeps detached views alive so their ids stay unique

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.detach:
            self._origin[id(out)] = self._origin.get(id(args[0]), id(args[0]))
            self._keep.append(out)
        elif func is torch.Tensor.cpu:
            self.ids.add(self._origin.get(id(args[0]), id(args[0])))
        return out


def test_checkpoint_copies_every_state_and_posterior_tensor_to_the_cpu(tiny):
    """build_checkpoint sends every tensor of train_state and posterior, however nested,
    through ``.cpu()`` (a no-op here, a device copy after a GPU run): the file never depends
    on where it was written. Checked structurally: this machine has no GPU to copy from."""
    from trainer import checkpoint as ckpt_io

    cfg, data, model = tiny
    buf, codes = torch.ones(3), torch.zeros(2)
    state = {"optimizer": {"state": {0: {"momentum_buffer": buf}}, "groups": [(buf, 1)]}}
    with CpuCopies() as seen:
        ckpt = ckpt_io.build_checkpoint(model, input_spec=data.spec.to_dict(), config={},
                                        split_seed=0, train_state=state,
                                        posterior={"kind": "pwfn", "codebook": [codes]})
    assert {id(buf), id(codes)} <= seen.ids
    assert isinstance(ckpt["train_state"]["optimizer"]["groups"][0], tuple)
    assert torch.equal(ckpt["posterior"]["codebook"][0], codes)
    assert all(v.device.type == "cpu" for v in ckpt["state_dict"].values())
    assert model_device(model).type == "cpu"


def test_checkpoint_of_an_nhwc_model_holds_the_standard_layout(tiny):
    """train.channels_last trains in NHWC; the checkpoint (and whatever reads it: the
    quantizers, the exporter's numpy views) gets the standard layout and the same values."""
    from trainer import checkpoint as ckpt_io
    from trainer.device import channels_last_

    cfg, data, model = tiny
    nhwc = channels_last_(copy.deepcopy(model))
    assert any(not p.is_contiguous() for p in nhwc.parameters())  # a conv weight moved
    ckpt = ckpt_io.build_checkpoint(nhwc, input_spec=data.spec.to_dict(), config={}, split_seed=0)
    for k, v in ckpt["state_dict"].items():
        assert v.is_contiguous(), k
        torch.testing.assert_close(v, model.state_dict()[k], rtol=0, atol=0, msg=k)
