"""``edge-sdk train`` / ``edge-sdk quantize`` argument handling: where runs are written and when
an existing run is left alone (the training itself is stubbed: these tests check the CLI)."""
from pathlib import Path

import pytest

import trainer.quantize.run as quantize_run
import trainer.train as train_module
from edge_sdk.cli import main as cli
from trainer.cli import quantized_dir


class _Stop(Exception):
    """Raised by the stubs: the CLI got as far as starting the work."""


@pytest.fixture
def stub_train(monkeypatch):
    calls = []

    def fake_train(cfg, out_dir=None, resume=False, progress=True, log=print):
        calls.append({"out": Path(out_dir or Path("runs") / cfg.name), "resume": resume})
        raise _Stop

    monkeypatch.setattr(train_module, "train", fake_train)
    return calls


@pytest.fixture
def existing_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / train_module.CHECKPOINT_NAME).write_bytes(b"an earlier run")
    return out


def test_train_refuses_to_overwrite_an_existing_run(existing_run, stub_train, capsys):
    assert cli.main(["train", "--out", str(existing_run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "already holds a run" in err, err
    assert "--resume" in err and "--force" in err
    assert stub_train == []  # nothing started
    assert (existing_run / "checkpoint.pt").read_bytes() == b"an earlier run"


def test_train_default_out_dir_is_checked_too(tmp_path, monkeypatch, stub_train, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "digits").mkdir(parents=True)
    (tmp_path / "runs" / "digits" / "checkpoint.pt").write_bytes(b"x")
    assert cli.main(["train", "--config", "digits"]) == 2
    assert "runs/digits already holds a run" in capsys.readouterr().err
    assert stub_train == []


@pytest.mark.parametrize("flag, resume", [("--force", False), ("--resume", True)])
def test_force_or_resume_lets_training_start(existing_run, stub_train, flag, resume):
    with pytest.raises(_Stop):
        cli.main(["train", "--out", str(existing_run), flag])
    assert stub_train == [{"out": existing_run, "resume": resume}]


def test_a_fresh_directory_needs_no_flag(tmp_path, stub_train):
    with pytest.raises(_Stop):
        cli.main(["train", "--out", str(tmp_path / "new")])
    assert len(stub_train) == 1


@pytest.mark.parametrize("checkpoint, expected", [
    ("/data/runs/digits/checkpoint.pt", "/data/runs/digits-pwfn"),
    ("/data/elsewhere/best.pt", "/data/elsewhere/best-pwfn"),
    ("checkpoint.pt", "checkpoint-pwfn"),
    ("runs/digits/checkpoint.pt", "runs/digits-pwfn"),
])
def test_quantized_dir_is_next_to_the_checkpoint(checkpoint, expected):
    assert quantized_dir(checkpoint, "pwfn") == Path(expected)


def test_quantize_writes_next_to_its_input_checkpoint_by_default(tmp_path, monkeypatch):
    seen = []

    def fake_quantize(checkpoint, cfg=None, out_dir=None, *, progress=True, log=print):
        seen.append(Path(out_dir))
        raise _Stop

    monkeypatch.setattr(quantize_run, "quantize_checkpoint", fake_quantize)
    monkeypatch.chdir(tmp_path)  # the working directory must not decide where it goes
    ckpt = tmp_path / "far" / "away" / "myrun" / "checkpoint.pt"
    for argv, out in [([], tmp_path / "far" / "away" / "myrun-sqs"),
                      (["--out", str(tmp_path / "chosen")], tmp_path / "chosen")]:
        with pytest.raises(_Stop):
            cli.main(["quantize", str(ckpt), "--method", "sqs", "--config", "digits", *argv])
        assert seen.pop() == out
    assert not (tmp_path / "runs").exists()
