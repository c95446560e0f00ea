"""edge_sdk.cli.main: lazy dispatch through entry points, error reporting, and no torch."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edge_sdk
from edge_sdk.cli import main as cli
from edge_sdk.errors import BudgetError

REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeEntryPoint:
    """Stands in for importlib.metadata.EntryPoint; records whether it was loaded."""

    def __init__(self, target: Callable[[list[str]], int | None] | BaseException) -> None:
        self.target = target
        self.loaded = False

    def load(self) -> Any:
        self.loaded = True
        if isinstance(self.target, BaseException):
            raise self.target
        return self.target


Register = Callable[..., dict[str, FakeEntryPoint]]


def _must_not_load() -> FakeEntryPoint:
    return FakeEntryPoint(AssertionError("this command must not be loaded"))


@pytest.fixture
def register(monkeypatch: pytest.MonkeyPatch) -> Register:
    def _register(**commands: FakeEntryPoint) -> dict[str, FakeEntryPoint]:
        monkeypatch.setattr(cli, "command_entry_points", lambda: commands)
        return commands

    return _register


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h"]])
def test_help_lists_commands_without_loading_them(
    argv: list[str], register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = register(train=_must_not_load(), run=_must_not_load(), bench=_must_not_load())
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "usage: edge-sdk" in out
    listed = [line.split()[0] for line in out.split("commands:")[1].splitlines() if line.strip()]
    assert [name for name in listed if name in commands] == ["bench", "run", "train"]
    assert not any(ep.loaded for ep in commands.values())


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert edge_sdk.__version__ in capsys.readouterr().out


def test_unknown_command_names_it_and_the_available_ones(
    register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = register(train=_must_not_load(), run=_must_not_load())
    assert cli.main(["trian", "--epochs", "3"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'trian'" in err
    assert "keygen, run, sign, train" in err  # sign and keygen: built in (issue 36)
    assert "did you mean 'train'" in err
    assert not any(ep.loaded for ep in commands.values())


def test_unknown_top_level_option(
    register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    register(run=_must_not_load())
    assert cli.main(["--verbose"]) == 2
    assert "unknown option '--verbose'" in capsys.readouterr().err


def test_only_the_invoked_command_is_loaded_and_gets_the_rest_of_argv(
    register: Register,
) -> None:
    received: list[list[str]] = []

    def run(argv: list[str]) -> int:
        received.append(argv)
        return 7

    commands = register(run=FakeEntryPoint(run), train=_must_not_load())
    assert cli.main(["run", "--width", "0.5", "model_dir"]) == 7
    assert received == [["--width", "0.5", "model_dir"]]
    assert commands["run"].loaded and not commands["train"].loaded


def test_command_returning_none_exits_zero(register: Register) -> None:
    register(profile=FakeEntryPoint(lambda argv: None))
    assert cli.main(["profile"]) == 0


def test_import_error_on_load_gives_install_hint(
    register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    register(train=FakeEntryPoint(ModuleNotFoundError("No module named 'torch'", name="torch")))
    assert cli.main(["train", "--config", "digits"]) == 2
    err = capsys.readouterr().err
    assert "'train'" in err
    assert "No module named 'torch'" in err
    assert f"needs the workstation install: {cli.WORKSTATION_INSTALL}" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_device_install_help_names_the_workstation_commands_and_how_to_get_them(
    register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = register(run=_must_not_load(), bench=_must_not_load(), profile=_must_not_load())
    assert cli.main(["--help"]) == 0
    lines = capsys.readouterr().out.split("commands:")[1].splitlines()
    assert [line.split()[0] for line in lines
            if line.strip() and line.split()[0] in commands] == ["bench", "profile", "run"]
    hinted = {line.split()[0] for line in lines
              if line.endswith(f"needs the workstation install: {cli.WORKSTATION_INSTALL}")}
    assert hinted == set(cli.WORKSTATION_COMMANDS) == {"train", "quantize", "export", "report", "demo"}
    assert cli.WORKSTATION_INSTALL == "pip install 'nested-edge-sdk-workstation'"


@pytest.mark.parametrize("name", ["train", "quantize", "export", "report", "demo"])
def test_workstation_command_on_a_device_install_is_one_line_exit_2_and_writes_nothing(
    name: str, register: Register, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = register(run=_must_not_load(), bench=_must_not_load(), profile=_must_not_load())
    monkeypatch.chdir(tmp_path)
    assert cli.main([name, "ckpt.pt", "--out", "out"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"edge-sdk: '{name}' needs the workstation install: "
                            f"pip install 'nested-edge-sdk-workstation'\n")
    assert list(tmp_path.iterdir()) == [] and not any(ep.loaded for ep in commands.values())


def test_a_device_command_that_fails_to_import_gets_no_workstation_hint(
    register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    register(run=FakeEntryPoint(ModuleNotFoundError("No module named 'numpy'", name="numpy")))
    assert cli.main(["run", "bundle"]) == 2
    err = capsys.readouterr().err
    assert "could not be loaded (No module named 'numpy')" in err and "workstation" not in err


def test_edge_sdk_error_is_reported_without_traceback(
    register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(argv: list[str]) -> int:
        raise BudgetError("latency budget 1 ms cannot be met; fastest width takes 3 ms")

    register(run=FakeEntryPoint(run))
    assert cli.main(["run"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: latency budget 1 ms cannot be met")
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_other_exceptions_propagate(register: Register) -> None:
    def run(argv: list[str]) -> int:
        raise RuntimeError("a bug, not a user error")

    register(run=FakeEntryPoint(run))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["run"])


def test_real_entry_point_lookup_returns_unloaded_entry_points() -> None:
    # Whatever is installed: names map to objects with load(), and looking them up imports nothing.
    before = set(sys.modules)
    found = cli.command_entry_points()
    assert all(isinstance(name, str) and callable(ep.load) for name, ep in found.items())
    new_modules = {mod.split(".")[0] for mod in set(sys.modules) - before}
    assert not new_modules & {"trainer", "exporters", "torch"}


def test_runtime_imports_without_torch() -> None:
    script = textwrap.dedent(
        """
        import sys

        class BlockTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")
                return None

        sys.meta_path.insert(0, BlockTorch())

        import edge_sdk
        import edge_sdk.cli.main
        import edge_sdk.answers.metrics

        edge_sdk.answers.metrics.summarize([[0.9, 0.1], [0.2, 0.8]], [0, 1])
        assert edge_sdk.cli.main.main(["--help"]) == 0  # lists the real commands without loading them
        forbidden = {"torch", "trainer", "exporters"}
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
        assert not loaded, loaded
        print("ok")
        """
    )
    pythonpath = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, pythonpath))}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_help_gives_one_line_per_command_saying_what_it_does(
    capsys: pytest.CaptureFixture[str]
) -> None:
    """The real commands (this checkout registers both wheels'): each on one line, with what
    it does beside it; a command without a summary would show its name alone."""
    assert cli.main(["--help"]) == 0
    section = capsys.readouterr().out.split("commands:\n")[1].split("\n\n")[0]
    lines = section.splitlines()
    names = [line.split()[0] for line in lines]
    assert len(names) == len(set(names))
    for line in lines:
        name, _, summary = line.strip().partition(" ")
        assert summary.strip(), f"{name} has no summary line"
    device = {"run", "bench", "profile", "materialize", "keygen", "sign"}
    assert device <= set(names) and device <= set(cli.SUMMARIES)
    assert set(cli.WORKSTATION_COMMANDS) <= set(cli.SUMMARIES)


def test_help_into_a_closed_pipe_ends_quietly() -> None:
    """`edge-sdk --help | head -1`: the reader is gone before the writer finishes; no
    BrokenPipeError traceback, the SIGPIPE exit code."""
    script = ("import sys, edge_sdk.cli.main as c, os\n"
              "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
              "sys.stdout = open(1, 'w', closefd=False)\n"
              "sys.exit(c.main(['--help']))\n")
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == cli.EXIT_BROKEN_PIPE, res.stderr
    assert res.stderr == ""


def test_the_console_script_into_head_prints_no_traceback() -> None:
    script = Path(sys.executable).with_name("edge-sdk")
    if not script.exists():
        pytest.skip("no edge-sdk console script next to this interpreter")
    res = subprocess.run(f"'{script}' --help | head -1", shell=True, capture_output=True,
                         text=True, timeout=60)
    assert res.stdout.startswith("usage: edge-sdk") and res.stdout.count("\n") == 1
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr


# --- bench and profile on every kind of bundle the exporter writes (issue 34) ---------------

def _as_uint8(src: Path, dst: Path) -> Path:
    """``src`` as the exporter writes it for 8-bit data: the same slices (their input is the
    normalised float tensor either way), the manifest's input declared ``uint8`` over
    [0, 255] with the mean and std in those units, so predict takes what ``src`` takes times
    255 / its range's top."""
    import shutil

    import yaml

    shutil.copytree(src, dst)
    path = dst / "manifest.yaml"
    m = yaml.safe_load(path.read_text())
    scale = 255.0 / float(m["input"]["value_range"][1])
    m["input"].update(dtype="uint8", value_range=[0.0, 255.0],
                      mean=[v * scale for v in m["input"]["mean"]],
                      std=[v * scale for v in m["input"]["std"]])
    path.write_text(yaml.safe_dump(m, sort_keys=False))
    return dst


@pytest.fixture(scope="module")
def bundle_kinds(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """float32 and uint8 inputs, files and store layouts: the exported test bundle (files),
    the hand-built store bundle of tests/store_support.py (no torch), and each as uint8."""
    import store_support

    work = tmp_path_factory.mktemp("bundle_kinds")
    store = store_support.build(work / "float32-store")
    return {"float32-files": bundle, "float32-store": store,
            "uint8-files": _as_uint8(bundle, work / "uint8-files"),
            "uint8-store": _as_uint8(store, work / "uint8-store")}


@pytest.mark.parametrize("kind", ["float32-files", "float32-store", "uint8-files", "uint8-store"])
def test_bench_and_profile_run_on_every_kind_of_bundle(
    kind: str, bundle_kinds: dict[str, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from edge_sdk.bundle import read_manifest

    monkeypatch.setenv("EDGE_SDK_CACHE", str(tmp_path / "cache"))
    path = bundle_kinds[kind]
    manifest = read_manifest(path)
    assert manifest.input.dtype == kind.split("-")[0]
    assert manifest.layout == kind.split("-")[1]
    ids = [c.id for c in manifest.configurations]

    assert cli.main(["bench", str(path), "--repeats", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["input"] == {"dtype": manifest.input.dtype,
                            "shape": list(manifest.input.shape[1:])}
    assert [r["config"] for r in out["configurations"]] == ids
    for r in out["configurations"]:
        assert r["invoke_ms"] > 0 and r["predict_ms"] > 0
        assert r["ratio"] == pytest.approx(r["predict_ms"] / r["invoke_ms"], rel=1e-2)

    assert cli.main(["bench", str(path), "--repeats", "2", "--config", ids[0]]) == 0
    table = capsys.readouterr().out.splitlines()
    assert f"input {manifest.input.dtype}" in table[0] and table[2].split()[0] == ids[0]

    prof = tmp_path / "profile.yaml"
    assert cli.main(["profile", str(path), "--threads", "1", "--repeats", "2", "--out", str(prof),
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == str(prof) and prof.is_file()
    assert sorted(r["config"] for r in out["rows"]) == sorted(ids)
    assert set(out["throughput"]["fp32"]) == {"1"}


def test_bench_input_has_the_declared_dtype_and_range() -> None:
    from types import SimpleNamespace

    from edge_sdk.cli.device import bench_input

    u8 = bench_input(SimpleNamespace(dtype="uint8", value_range=(0.0, 255.0),
                                     shape=(1, 32, 32, 3)))
    assert u8.dtype == np.uint8 and u8.shape == (32, 32, 3) and u8.max() > 200
    f = bench_input(SimpleNamespace(dtype="float32", value_range=(0.0, 16.0), shape=(1, 8, 8, 1)))
    assert f.dtype == np.float32 and 0 <= f.min() and f.max() <= 16


def test_bench_refuses_an_unknown_configuration(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", str(bundle), "--config", "w9.99-point"]) == 2
    err = capsys.readouterr().err
    assert "'w9.99-point' is not a configuration" in err and len(err.splitlines()) == 1
