"""End-to-end training on digits, checkpoints, resume and multi-process training."""
import os
import socket

import pytest
import torch

from edge_sdk.errors import CheckpointError
from trainer import checkpoint as ckpt_io
from trainer.config import config_from_dict, load_config
from trainer.data import load_data
from trainer.train import CHECKPOINT_NAME, train


@pytest.mark.slow
def test_short_digits_run_is_accurate_and_ordered(digits_run):
    _, result = digits_run
    acc = {w: r["accuracy"] for w, r in result.test.items()}
    assert acc[1.0] >= 0.90, acc
    widths = sorted(acc)
    for small, large in zip(widths, widths[1:]):
        assert acc[large] >= acc[small] - 0.02, f"accuracy drops with width: {acc}"
    assert all(0 <= r["ece"] <= 1 and r["nll"] > 0 for r in result.test.values())


@pytest.mark.parametrize("noise_start,nhwc", [(1.0, True), (0.0, False)])
def test_training_runs_nhwc_weights_only_without_noise_and_hands_back_the_standard_layout(
        tmp_path, monkeypatch, noise_start, nhwc):
    """train.channels_last trains a noise-free recipe with NHWC weights (a recipe that samples
    weight noise keeps NCHW, where its noisy passes are faster); the model train() returns,
    which the CLI hands to the quantizers, is back in the standard layout."""
    import trainer.train as T

    seen = []  # a convolution weight's layout at every training forward
    build = T.build_model

    def spy(cfg, data):
        model = build(cfg, data)
        # a conv weight whose layouts differ (one input channel would be contiguous in both)
        w = next(p for p in model.parameters() if p.ndim == 4 and p.shape[1] > 1)
        model.register_forward_pre_hook(lambda m, x: seen.append(
            w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous())
            if m.training else None)
        return model
    monkeypatch.setattr(T, "build_model", spy)
    cfg = load_config("digits", ["train.epochs=1", "train.eval_every=100",
                                 f"bayes.noise_start={noise_start}"])
    result = train(cfg, tmp_path, progress=False, log=lambda *a, **k: None)
    assert seen and all(v == nhwc for v in seen)
    assert any(p.ndim == 4 for p in result.model.parameters())  # it has convolutions
    assert all(p.is_contiguous() for p in result.model.parameters())


def test_checkpoint_round_trip_gives_identical_outputs(digits_run):
    cfg, result = digits_run
    ckpt = ckpt_io.load_checkpoint(result.checkpoint)
    assert ckpt["arch"] == result.model.arch
    assert config_from_dict(ckpt["config"]) == cfg
    assert ckpt["classes"] == [str(i) for i in range(10)]
    assert tuple(ckpt["input_spec"]["shape"]) == (1, 8, 8, 1)
    assert set(ckpt["metrics"]["test"]) == {"0.25", "0.5", "0.75", "1"}
    assert ckpt["train_state"]["epoch"] == cfg.train.epochs - 1  # resumable with more epochs
    for unit in ckpt["orderings"].values():
        keep = unit["keep_probability"]
        assert keep[: unit["frozen"]] == [1.0] * unit["frozen"]
        assert all(a >= b for a, b in zip(keep, keep[1:]))
    loaded = ckpt_io.model_from_checkpoint(ckpt)
    x = load_data(cfg.data).test.x[:32]
    original = result.model.eval()
    for w in (0.25, 1.0):
        with torch.no_grad(), original.width(w), loaded.width(w):
            assert torch.equal(original(x), loaded(x))


def test_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt_io.load_checkpoint(tmp_path / "missing.pt")
    torch.save({"format": "something-else"}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not an edge-sdk checkpoint"):
        ckpt_io.load_checkpoint(tmp_path / "other.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a zip file")
    with pytest.raises(CheckpointError, match="not an edge-sdk checkpoint"):
        ckpt_io.load_checkpoint(tmp_path / "garbage.pt")

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"format": ckpt_io.FORMAT, "payload": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match=r"not an edge-sdk checkpoint.*\(posix\.system\)"):
        ckpt_io.load_checkpoint(tmp_path / "evil.pt")  # weights_only refuses code


def _not_checkpoints(tmp_path):
    """Files users pass by mistake: each is refused by torch.load(weights_only=True) with
    advice to set weights_only=False, which must never reach them."""
    import pickle

    import numpy as np

    (tmp_path / "garbage.pt").write_bytes(b"not a zip file")
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "config.yaml").write_text("train: {epochs: 3}\n")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")  # a whole pickled model
    torch.save({"weights": torch.zeros(3)}, tmp_path / "plain.pt")
    np.savez(tmp_path / "data.npz", x=np.zeros(3))
    with open(tmp_path / "obj.pkl", "wb") as f:
        pickle.dump({"a": 1}, f)
    return sorted(p for p in tmp_path.iterdir() if p.is_file())


def test_non_checkpoints_are_named_as_such_without_torch_advice(tmp_path):
    for path in _not_checkpoints(tmp_path):
        with pytest.raises(CheckpointError) as info:
            ckpt_io.load_checkpoint(path)
        message = str(info.value)
        assert f"{path} is not an edge-sdk checkpoint" in message, message
        assert "weights_only" not in message and "torch.load" not in message, message
        # torch's own exception is not chained on: its text would reach a traceback
        assert info.value.__cause__ is None
        assert info.value.__context__ is None or info.value.__suppress_context__


@pytest.mark.parametrize("command", ["quantize", "export"])
def test_cli_on_a_non_checkpoint_says_so_in_one_line(tmp_path, capsys, command):
    from edge_sdk.cli import main as cli

    (tmp_path / "in").mkdir()
    for path in _not_checkpoints(tmp_path / "in"):
        extra = ["--out", str(tmp_path / "bundle")] if command == "export" else []
        assert cli.main([command, str(path), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "not an edge-sdk checkpoint" in err, err
        assert "weights_only" not in err and err.count("\n") == 1, err
    assert not (tmp_path / "bundle").exists()


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    cfg = load_config("digits", ["train.epochs=2", "data.calib_samples=64",
                                 "train.eval_widths=[1.0]"])
    quiet = lambda *a: None  # noqa: E731
    full = train(cfg, tmp_path / "full", progress=False, log=quiet)

    def interrupt_in_epoch_2(msg):
        if msg.startswith("epoch 2"):
            raise KeyboardInterrupt  # after epoch 1's checkpoint was written

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "cut", progress=False, log=interrupt_in_epoch_2)
    half = ckpt_io.load_checkpoint(tmp_path / "cut" / CHECKPOINT_NAME)
    assert half["train_state"]["epoch"] == 0
    resumed = train(cfg, tmp_path / "cut", resume=True, progress=False, log=quiet)
    for (k, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), f"{k} differs after resume"
    other = load_config("digits", ["train.epochs=2", "model.groups=4"])
    with pytest.raises(CheckpointError, match="cannot resume"):
        train(other, tmp_path / "cut", resume=True, progress=False, log=quiet)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
def test_two_process_gloo_run_keeps_ranks_identical(tmp_path):
    import torch.multiprocessing as mp

    from ddp_worker import run_worker

    port = _free_port()
    mp.spawn(run_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    a = torch.load(tmp_path / "rank0.pt", weights_only=True)
    b = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert a.keys() == b.keys()
    start = torch.load(tmp_path / "init.pt", weights_only=True)
    moved = False
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs between ranks"
        moved |= not torch.equal(a[k], start[k])
    assert moved, "parameters did not change: no training happened"
    assert (tmp_path / "out" / CHECKPOINT_NAME).is_file()


def test_onecycle_rises_to_the_peak_then_anneals_below_the_start():
    from trainer.train import onecycle

    total, warm = 1000, 0.3
    f = [onecycle(s, total, warm) for s in range(total + 1)]
    peak = f.index(max(f))
    assert abs(f[0] - 1 / 25) < 1e-9 and abs(max(f) - 1.0) < 1e-9 and peak == 300
    assert all(a <= b for a, b in zip(f[:peak], f[1:peak + 1]))  # rises
    assert all(a >= b for a, b in zip(f[peak:], f[peak + 1:]))  # then only falls
    assert abs(f[-1] - 1 / 25 / 1e4) < 1e-12
