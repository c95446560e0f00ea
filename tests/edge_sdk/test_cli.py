"""edge_sdk.cli: lazy dispatch through entry points, error reporting, and no torch."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import edge_sdk
from edge_sdk import cli
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
    listed = [line.strip() for line in out.split("commands:")[1].splitlines()]
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
    assert [line.strip() for line in lines if line.strip() in commands] == ["bench", "profile", "run"]
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
        import edge_sdk.cli
        import edge_sdk.metrics

        edge_sdk.metrics.summarize([[0.9, 0.1], [0.2, 0.8]], [0, 1])
        assert edge_sdk.cli.main(["--help"]) == 0  # lists the real commands without loading them
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
