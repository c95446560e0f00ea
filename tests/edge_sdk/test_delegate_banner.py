"""The XNNPACK delegate's "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." line, which
LiteRT's C++ logging writes to fd 2 once per process, is not printed by CLI calls; whatever else
goes to fd 2 meanwhile still does. The CLI checks run in subprocesses: the line is printed once
per process, and this test process has long since printed it. (Measured with LiteRT 2.3 and
tflite-runtime 2.14 alike.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.backends import _BANNER, quiet_delegate_banner
from edge_sdk.bundle import read_manifest

EXE = Path(sys.executable).parent / "edge-sdk"
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, env=ENV,
                          timeout=300)


class FakeInterpreter:
    """Writes the banner and a real warning to fd 2 on allocate, as the C++ logger does."""

    made = 0

    def __init__(self, model_content: bytes, num_threads: int) -> None:
        type(self).made += 1

    def allocate_tensors(self) -> None:
        os.write(2, b"WARNING: something worth reading\n" + _BANNER)


def test_the_banner_is_swallowed_and_everything_else_passes(capfd):
    quiet_delegate_banner(FakeInterpreter)
    quiet_delegate_banner(FakeInterpreter)  # once per process and backend
    assert FakeInterpreter.made == 1
    err = capfd.readouterr().err
    assert err == "WARNING: something worth reading\n"


def test_run_prints_no_xnnpack_line(bundle, tmp_path):
    shape = read_manifest(bundle).input.shape[1:]
    np.save(tmp_path / "x.npy", np.zeros(shape, np.float32))
    r = _cli("run", str(bundle), "--input", str(tmp_path / "x.npy"))
    assert r.returncode == 0, r.stderr
    assert "XNNPACK" not in r.stderr and "INFO:" not in r.stderr, r.stderr
    assert "confidence" in r.stdout


def test_report_prints_no_xnnpack_line(bundle, tmp_path):
    pytest.importorskip("torch", exc_type=ImportError)
    pytest.importorskip("matplotlib")
    r = _cli("report", str(bundle), "--out", str(tmp_path / "report"), "--max-eval", "10")
    assert r.returncode == 0, r.stderr
    assert "XNNPACK" not in r.stderr, r.stderr
