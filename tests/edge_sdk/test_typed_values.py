"""Issue 36 §3, "every bad value is typed": the audit's raw exceptions and silent wrong answers,
one by one, each now a typed error naming what was wrong and what was expected. Real bundle,
real interpreter; no torch."""
from __future__ import annotations

import io
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

import edge_sdk
from edge_sdk.cli import main as cli
from edge_sdk.policy.budget import Budget
from edge_sdk.bundle import MANIFEST_NAME, read_manifest
from edge_sdk.errors import (
    BudgetError,
    BundleError,
    ConfigError,
    InputError,
    OutputError,
    ProfileError,
)
from edge_sdk.tflite.build import GraphBuilder
from edge_sdk.inputs.files import read_input
from edge_sdk.policy.profiles import load_profile


# ------------------------------------------------------------------------ numbers in the API
@pytest.mark.parametrize("kw", [{"latency_ms": 10 ** 400}, {"memory_mb": 10 ** 400},
                                {"latency_ms": 1e300}, {"memory_mb": math.inf}])
def test_budget_values_are_bounded_not_overflowing(kw):
    with pytest.raises(BudgetError, match=r"Budget\.\w+ must be at most"):
        Budget(**kw)


@pytest.mark.parametrize("kw, message", [
    ({"hysteresis": 10 ** 400}, r"hysteresis must be a finite number in \[0, 0\.9\], got <an "
                                r"integer of 1329 bits>"),
    ({"half_life_s": 10 ** 400}, r"half_life_s must be a finite number"),
    ({"half_life_calls": 10 ** 400}, r"half_life_calls must be an integer"),
    ({"threads": 10 ** 400}, r"threads must be an integer in \[1, 1024\].*<an integer of"),
    ({"target_accuracy": 10 ** 400}, r"target_accuracy must be a number in \(0, 1\]")])
def test_load_arguments_beyond_float_range_are_typed(bundle, kw, message):
    with pytest.raises(ConfigError, match=message):
        edge_sdk.load(bundle, profile=None, **kw)


# ------------------------------------------------------------------- manifest numbers, YAML
def _edited(bundle: Path, dst: Path, edit) -> Path:
    shutil.copytree(bundle, dst)
    data = yaml.safe_load((dst / MANIFEST_NAME).read_text())
    edit(data)
    (dst / MANIFEST_NAME).write_text(yaml.safe_dump(data, sort_keys=False))
    return dst


@pytest.mark.parametrize("where, value, message", [
    (("input", "std"), [1e-45], r"input\.std\[0\]: expected a positive number float32 can "
                                r"carry"),
    (("input", "std"), [1e39], r"input\.std\[0\]: expected a number float32 can carry"),
    (("input", "mean"), [-1e39], r"input\.mean\[0\]: expected a number float32 can carry"),
    (("configurations", 0, "temperature"), 5e-324, r"temperature: expected a positive number "
                                                   r"float32 can carry")])
def test_manifest_numbers_float32_cannot_carry_are_refused(bundle, tmp_path, where, value,
                                                           message):
    """The audit's silent NaN answers: std 1e-45 and temperature 5e-324 gave NaN probabilities,
    label 0, abstain false; std 1e39 gave one answer for every input."""
    def edit(d):
        node = d
        for k in where[:-1]:
            node = node[k]
        node[where[-1]] = value
    with pytest.raises(BundleError, match=message):
        edge_sdk.load(_edited(bundle, tmp_path / "b", edit), profile=None)


def test_a_normalised_range_float32_cannot_carry_is_refused(bundle, tmp_path):
    def edit(d):
        d["input"]["value_range"], d["input"]["std"] = [0.0, 3e38], [0.5]
    with pytest.raises(BundleError, match=r"input\.std\[0\]: \(value_range - mean\) / std "
                                          r"overflows float32 with std 0\.5"):
        edge_sdk.load(_edited(bundle, tmp_path / "b", edit), profile=None)


def test_a_duplicate_manifest_key_is_refused(bundle, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(bundle, b)
    text = (b / MANIFEST_NAME).read_text()
    (b / MANIFEST_NAME).write_text(text.replace("  temperature: ", "  temperature: 0.5\n"
                                                "  temperature: ", 1))
    with pytest.raises(BundleError, match=r"duplicate key 'temperature' at line \d+, column 3"):
        read_manifest(b)


def test_a_duplicate_profile_key_is_refused_on_one_line(tmp_path):
    p = tmp_path / "dev.yaml"
    p.write_text("name: a\nname: b\n")
    with pytest.raises(ProfileError, match=r"duplicate key 'name' at line 2") as info:
        load_profile(p)
    assert "\n" not in str(info.value)
    p.write_text("name: [unclosed\n  x: {\n")
    with pytest.raises(ProfileError, match="not valid YAML") as info:
        load_profile(p)
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------- non-finite answers
@pytest.mark.parametrize("sign", [1, -1])
def test_logits_that_overflow_are_refused_not_answered_as_nan(bundle, tmp_path, sign):
    """Finite weights can still overflow float32 together: the answer is an OutputError, never
    NaN probabilities with label 0. -inf logits make a finite softmax (exp(-inf) = 0): only
    the answer graph's guard (edge_sdk.answers.graph) turns them into the NaN that is refused."""
    spec = read_manifest(bundle).input
    n_in = int(np.prod(spec.shape))
    g = GraphBuilder()
    x = g.add_input("input", spec.shape)
    f = g.reshape(x, (-1, n_in), name="flat")
    w = np.full((10, n_in), sign * 3e38, np.float32)  # x * 3e38 summed over 64 inputs: inf
    w[0] = 0.0  # one finite logit: with -inf elsewhere the softmax alone would answer 0
    g.mark_output(g.fully_connected(f, g.add_const(w, "w"), None, name="fc"), "logits")
    blob = g.finish(resizable_batch=True)
    b = tmp_path / "b"
    shutil.copytree(bundle, b)
    m = read_manifest(b)
    point = next(c for c in m.configurations if c.scope == "point")
    name = point.files[0].name
    (b / name).write_bytes(blob)
    import hashlib

    data = yaml.safe_load((b / MANIFEST_NAME).read_text())
    for c in data["configurations"]:
        for f_ in c["files"]:
            if f_["name"] == name:
                f_["sha256"], f_["bytes"] = hashlib.sha256(blob).hexdigest(), len(blob)
    (b / MANIFEST_NAME).write_text(yaml.safe_dump(data, sort_keys=False))
    model = edge_sdk.load(b, profile=None, uncertainty=False)  # a hand-made slice: no features
    assert model._interpreters(point)[0][3] >= 0  # answered by the graph
    xin = np.full(spec.shape[1:], spec.value_range[1], np.float32)
    with pytest.raises(OutputError, match=rf"configuration '{point.id}' answered non-finite "
                                          r"values \(9 of 10 logits"):
        model.predict(xin, config_id=point.id)
    # a batch of a point does not read its logits unless one is not finite: then it names them
    with pytest.raises(OutputError, match=r"non-finite values \(18 of 20 logits"):
        model.predict_batch(np.stack([xin, xin]), config_id=point.id)


# ----------------------------------------------------------------------------- .npy inputs
def _npy_header(shape, descr="<f8") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


@pytest.fixture
def spec(bundle):
    return read_manifest(bundle).input


def test_a_npy_declaring_a_trillion_elements_is_refused_before_allocating(tmp_path, spec):
    p = tmp_path / "x.npy"
    p.write_bytes(_npy_header((10 ** 12,)) + bytes(8))
    assert p.stat().st_size < 200  # the audit's 137 bytes
    with pytest.raises(InputError, match=r"declares a float64 array of shape \[1000000000000\] "
                                         r"\(8000000000000 bytes\) but holds 8 bytes"):
        read_input(str(p), spec)


@pytest.mark.parametrize("content, what", [
    (b"hello\n", "a text file"), (b"\x89PNG\r\n\x1a\n" + bytes(20), "a PNG image"),
    (b"PK\x03\x04" + bytes(20), "a zip archive"), (b"\x80\x04\x95" + bytes(9), "a Python pickle"),
    (b"", "an empty file")])
def test_a_file_that_is_not_npy_is_named_for_what_it_is(tmp_path, spec, content, what):
    p = tmp_path / "x.npy"
    p.write_bytes(content)
    with pytest.raises(InputError, match=rf"is not a \.npy array: it is {what}"):
        read_input(str(p), spec)


def test_a_truncated_npy_and_an_object_npy_are_typed(tmp_path, spec):
    buf = io.BytesIO()
    np.save(buf, np.zeros(spec.shape[1:], np.float32))
    (tmp_path / "t.npy").write_bytes(buf.getvalue()[:-5])
    with pytest.raises(InputError, match="truncated or not a .npy file numpy wrote"):
        read_input(str(tmp_path / "t.npy"), spec)
    np.save(tmp_path / "o.npy", np.array([{}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="holds Python objects"):
        read_input(str(tmp_path / "o.npy"), spec)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_named_as_one_not_as_missing(tmp_path, spec):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(InputError, match=r"is a FIFO \(named pipe\), not a regular file"):
        read_input(str(tmp_path / "pipe"), spec)


# --------------------------------------------------------------------------- one-line CLI
@pytest.mark.parametrize("argv", [["run"], ["run", "b", "--input"], ["run", "b", "--input", "x",
                                  "--threads", "many"], ["materialize", "b"], ["sign", "b"],
                                  ["bench", "--repeats"], ["--bogus"]])
def test_argparse_errors_are_one_line_exit_2(capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err


def test_a_newline_in_a_path_stays_on_one_line(bundle, tmp_path, capsys):
    assert cli.main(["run", str(bundle), "--input", str(tmp_path / "a\nb.npy")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a\\nb.npy does not exist" in err


def test_help_still_prints_and_exits_0(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "--help"])
    assert info.value.code == 0 and "usage: edge-sdk run" in capsys.readouterr().out
