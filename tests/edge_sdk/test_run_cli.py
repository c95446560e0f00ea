"""Issue 19 §3, the CLI: `edge-sdk run` answers bad input files in one line with exit 2, a
valid budget strict mode cannot meet with exit 3; images are taken as they are unless
--resize; 16-bit PNGs are scaled by bit depth; --profile, --strict and --explain. Real
bundle, no torch."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edge_sdk.bundle import read_manifest
from edge_sdk.cli import main as cli
from edge_sdk.cli.main import main
from edge_sdk.cli.device import _read_input
from edge_sdk.errors import InputError

Image = pytest.importorskip("PIL.Image")  # a dev-extra dependency
EXIT_INVALID, EXIT_BUDGET_NOT_MET = 2, 3  # documented: README (CLI), `edge-sdk run --help`


def test_the_exit_codes_are_distinct_and_documented():
    assert (cli.EXIT_INVALID, cli.EXIT_BUDGET_NOT_MET) == (EXIT_INVALID, EXIT_BUDGET_NOT_MET)
    from edge_sdk.cli.device import EXIT_CODES
    assert "2  invalid input" in EXIT_CODES and "3  --strict" in EXIT_CODES


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_SDK_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def spec(bundle):
    return read_manifest(bundle).input


@pytest.fixture
def sample(spec, tmp_path):
    lo, hi = spec.value_range
    path = tmp_path / "x.npy"
    np.save(path, np.full(spec.shape[1:], (lo + hi) / 2, np.float32))
    return path


def run(bundle, *args) -> int:
    return main(["run", str(bundle), *map(str, args)])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# --------------------------------------------------------------------------- bad input files
def bad_files(tmp_path, spec):
    _, h, w, _ = spec.shape
    obj = tmp_path / "object.npy"
    np.save(obj, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    corrupt = tmp_path / "corrupt.npy"
    corrupt.write_bytes(b"\x93NUMPY\x01\x00garbage")
    text = tmp_path / "notes.png"
    text.write_text("not an image at all")
    npz = tmp_path / "arrays.npy"
    np.savez(npz, a=np.zeros(3))  # written as arrays.npy.npz
    rgb = tmp_path / "noise.png"  # the audit's case: 64x48 RGB noise on an 8x8 grey model
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(rgb)
    big = tmp_path / "big.png"
    Image.fromarray(np.zeros((h * 2, w * 2), np.uint8)).save(big)
    colour = tmp_path / "colour.png"
    Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(colour)
    rgba = tmp_path / "rgba.png"
    Image.fromarray(np.zeros((h, w, 4), np.uint8)).save(rgba)
    return {"object .npy": (obj, "Python objects"), "corrupt .npy": (corrupt, "not a valid .npy"),
            "text as .png": (text, "not a readable image"), "a directory": (tmp_path, "directory"),
            ".npz renamed": (tmp_path / "arrays.npy.npz", "not a readable image"),
            "64x48 RGB noise": (rgb, "--resize"), "wrong size": (big, "--resize"),
            "RGB on grey": (colour, "3 channel"), "RGBA on grey": (rgba, "4 channel")}


CASES = ["object .npy", "corrupt .npy", "text as .png", "a directory", ".npz renamed",
         "64x48 RGB noise", "wrong size", "RGB on grey", "RGBA on grey"]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_input_file_is_one_line_and_exit_2(bundle, spec, tmp_path, capsys, case):
    path, words = bad_files(tmp_path, spec)[case]
    assert run(bundle, "--input", path) == EXIT_INVALID
    assert words in one_line_error(capsys)
    assert capsys.readouterr().out == ""  # no answer printed


@pytest.mark.parametrize("budget", [["--latency-ms", "-1"], ["--latency-ms", "0"],
                                    ["--latency-ms", "nan"], ["--memory-mb", "-3"]])
def test_a_malformed_budget_is_exit_2(bundle, sample, capsys, budget):
    assert run(bundle, "--input", sample, *budget) == EXIT_INVALID
    assert "Budget." in one_line_error(capsys)


def test_resize_is_explicit(bundle, spec, tmp_path, capsys):
    path, _ = bad_files(tmp_path, spec)["64x48 RGB noise"]
    assert run(bundle, "--input", path, "--resize", "--json") == 0
    (out,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out["class_name"] in read_manifest(bundle).labels
    x = _read_input(str(path), spec, resize=True)
    assert x.shape == tuple(spec.shape[1:])
    with pytest.raises(InputError, match="--resize"):
        _read_input(str(path), spec)


def test_a_16_bit_png_is_scaled_by_its_bit_depth(spec, tmp_path):
    _, h, w, _ = spec.shape
    px = np.linspace(0, 65535, h * w).reshape(h, w).astype(np.uint16)
    path = tmp_path / "deep.png"
    Image.fromarray(px).save(path)
    x = _read_input(str(path), spec)
    lo, hi = spec.value_range
    np.testing.assert_allclose(x[..., 0], px / 65535 * (hi - lo) + lo, rtol=1e-5, atol=1e-5)
    assert x.max() == pytest.approx(hi) and len(np.unique(x)) == h * w  # nothing saturated
    big = tmp_path / "deep_big.png"
    Image.fromarray(np.full((h * 2, w * 2), 32768, np.uint16)).save(big)
    y = _read_input(str(big), spec, resize=True)
    np.testing.assert_allclose(y, 32768 / 65535 * (hi - lo) + lo, rtol=1e-4)


# ------------------------------------------------------------- strict, profile, explain
def test_strict_mode_exit_3_when_a_valid_budget_cannot_be_met(bundle, sample, capsys):
    assert run(bundle, "--input", sample, "--latency-ms", "1e-9", "--strict") == \
        EXIT_BUDGET_NOT_MET
    assert "no configuration fits latency" in one_line_error(capsys)
    assert run(bundle, "--input", sample, "--memory-mb", "1e-6", "--strict") == \
        EXIT_BUDGET_NOT_MET
    assert "MB short" in one_line_error(capsys)


def test_without_strict_an_unmet_budget_answers_and_says_missed(bundle, sample, capsys):
    assert run(bundle, "--input", sample, "--latency-ms", "1e-9") == 0
    assert "budget MISSED" in capsys.readouterr().out


@pytest.mark.parametrize("profile", ["raspberry_pi_4", "none"])
def test_profile_is_passed_to_load(bundle, sample, capsys, profile):
    assert run(bundle, "--input", sample, "--profile", profile, "--explain") == 0
    out = capsys.readouterr().out
    assert ("raspberry_pi_4" in out) == (profile == "raspberry_pi_4")


def test_an_unknown_profile_is_exit_2(bundle, sample, capsys):
    assert run(bundle, "--input", sample, "--profile", "no_such_board") == EXIT_INVALID
    assert "no_such_board" in one_line_error(capsys)


def test_explain_prints_the_decision_table_before_the_answer(bundle, sample, capsys):
    assert run(bundle, "--input", sample, "--explain") == 0
    out = capsys.readouterr().out
    ids = [c.id for c in read_manifest(bundle).configurations]
    assert all(i in out for i in ids)
    assert "chosen:" in out and out.index("chosen:") < out.index("confidence")
    assert run(bundle, "--input", sample, "--explain", "--json") == 0
    first, second = capsys.readouterr().out.splitlines()
    table = json.loads(first)["explain"]
    assert table["chosen"] == json.loads(second)["config_id"]
    assert {r["config_id"] for r in table["rows"]} == set(ids)
