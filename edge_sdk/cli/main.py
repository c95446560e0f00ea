"""The ``edge-sdk`` console script.

Subcommands are registered by each package in the ``edge_sdk.commands`` entry-point group and
are imported only when invoked, so device-side commands work without the workstation
packages (torch) installed, and listing commands never imports any of them. Each entry
point resolves to ``fn(argv: list[str]) -> int | None`` that parses its own arguments.

The device wheel (``nested-edge-sdk``) registers run / bench / profile / materialize; the
workstation wheel (``nested-edge-sdk-workstation``) adds train / quantize / export / report /
demo. On a device install those are listed and answered with the one line that says how to
get them (exit 2, nothing imported, nothing written).
"""
from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Any, NoReturn, Protocol

from edge_sdk import __version__
from edge_sdk.errors import BudgetNotMetError, EdgeSdkError

ENTRY_POINT_GROUP = "edge_sdk.commands"
PROG = "edge-sdk"
DEVICE_DIST = "nested-edge-sdk"
WORKSTATION_DIST = "nested-edge-sdk-workstation"
WORKSTATION_INSTALL = f"pip install '{WORKSTATION_DIST}'"
# The workstation wheel's commands (packaging/workstation/pyproject.toml; a test keeps the two
# in step), named here so that a device install can say where they come from.
WORKSTATION_COMMANDS = ("train", "quantize", "export", "report", "demo")
_NEEDS_WORKSTATION = f"needs the workstation install: {WORKSTATION_INSTALL}"
# One line per command for the top-level --help (a command registered by another package
# without a line here is listed by name alone)
SUMMARIES = {
    "train": "train the nested Bayesian network on a config's data; prints the checkpoint path",
    "quantize": "PWFN or SQS on a trained checkpoint: one shared codebook, a quantized posterior",
    "export": "checkpoint -> bundle: per-width TFLite slices + a manifest of measured quality",
    "report": "Markdown report of a bundle: reliability, width, risk-coverage, trace figures",
    "demo": "the whole pipeline on scikit-learn's digits, offline, then a budget replay",
    "run": "predict an input (.npy or image) with a bundle under a latency/memory budget",
    "bench": "per-configuration latency of predict() against the raw interpreter invoke()",
    "profile": "measure this device on a bundle's slices and write a device profile",
    "materialize": "write a store bundle as plain .tflite files, for apps outside Python",
    "keygen": "make an Ed25519 key pair for signing bundles",
    "sign": "sign a bundle's manifest with an Ed25519 private key",
}
# Exit codes: 0 success; 2 invalid input of any kind (arguments, files, a malformed budget:
# every EdgeSdkError); 3 a valid budget that strict mode could not meet (BudgetNotMetError)
EXIT_INVALID = 2
EXIT_BUDGET_NOT_MET = 3
EXIT_BROKEN_PIPE = 141


class CommandEntryPoint(Protocol):
    """What the dispatcher needs of an entry point (``importlib.metadata.EntryPoint``)."""

    def load(self) -> Any: ...


def command_entry_points() -> Mapping[str, CommandEntryPoint]:
    """The registered subcommands by name, not loaded."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _missing_workstation(names: Sequence[str]) -> list[str]:
    """The workstation commands this install does not register."""
    return sorted(set(WORKSTATION_COMMANDS) - set(names))


def _usage(names: Sequence[str]) -> str:
    missing = _missing_workstation(names)
    width = max(map(len, [*names, *missing]), default=0)
    listing = "\n".join(f"  {name:<{width}}  {SUMMARIES.get(name, '')}".rstrip()
                        for name in names) or (
        f"  (none registered; is {DEVICE_DIST} installed? Commands come from the "
        f"'{ENTRY_POINT_GROUP}' entry points)"
    )
    listing += "".join(f"\n  {name:<{width}}  {_NEEDS_WORKSTATION}" for name in missing)
    return (
        f"usage: {PROG} <command> [arguments...]\n"
        f"       {PROG} --version\n\n"
        f"commands:\n{listing}\n\n"
        f"Run '{PROG} <command> --help' for the arguments of a command."
    )


def _unknown_command(name: str, names: Sequence[str]) -> str:
    available = ", ".join(names) or "none registered"
    message = f"{PROG}: unknown command '{name}'; available commands: {available}"
    close = difflib.get_close_matches(name, [*names, *_missing_workstation(names)], n=1)
    return message + (f" (did you mean '{close[0]}'?)" if close else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv`` (default ``sys.argv[1:]``) to a subcommand; return the exit code.

    ``SystemExit`` raised by a command's own argparse (``--help``, bad arguments) propagates.
    A reader that closes the pipe early (``edge-sdk --help | head -1``) ends the command
    quietly, exit code 141 (128 + SIGPIPE, what a shell tool killed by it returns), with no
    traceback.
    """
    try:
        try:
            code = _dispatch(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
    except BrokenPipeError:
        # Python would flush stdout again at exit and print "Exception ignored ...": point it
        # at /dev/null first (the recipe of Python's signal module documentation)
        import os

        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # no real file descriptor (a test's captured stdout)
            pass
        return EXIT_BROKEN_PIPE
    return code


def _dispatch(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {**{k: _Builtin(v) for k, v in BUILTIN_COMMANDS.items()}, **command_entry_points()}
    names = sorted(commands)

    if not args or args[0] in ("-h", "--help"):
        print(_usage(names))
        return 0
    if args[0] == "--version":
        print(f"{PROG} {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name.startswith("-"):
        print(one_line(f"{PROG}: unknown option '{name}' (run '{PROG} --help' for the "
                       "commands)"), file=sys.stderr)
        return 2
    if name not in commands:
        if name in WORKSTATION_COMMANDS:  # a device install: say how to get it, touch nothing
            print(f"{PROG}: '{name}' {_NEEDS_WORKSTATION}", file=sys.stderr)
        else:
            print(_unknown_command(name, names), file=sys.stderr)
        return 2

    try:
        command: Callable[[list[str]], int | None] = commands[name].load()
    except ImportError as exc:
        hint = f"; it {_NEEDS_WORKSTATION}" if name in WORKSTATION_COMMANDS else ""
        print(f"{PROG}: the '{name}' command could not be loaded ({exc}){hint}", file=sys.stderr)
        return 2

    try:
        with _one_line_argparse():
            code = command(rest)
    except _ArgumentError as exc:  # argparse's usage block + error, as one line
        print(one_line(f"{exc.prog}: error: {exc.message} (run '{exc.prog} --help' for its "
                       "arguments)"), file=sys.stderr)
        return EXIT_INVALID
    except BudgetNotMetError as exc:  # a valid budget strict mode could not meet: not bad input
        print(one_line(f"error: {exc}"), file=sys.stderr)
        return EXIT_BUDGET_NOT_MET
    except EdgeSdkError as exc:
        # Our own errors already say what was wrong and what was expected; a traceback adds noise.
        print(one_line(f"error: {exc}"), file=sys.stderr)
        return EXIT_INVALID
    return 0 if code is None else int(code)


def one_line(message: str) -> str:
    """``message`` on one line whatever it holds (a newline in a path, or a
    multi-line message, broke the one-line error): control characters escaped as Python
    would write them (``\\n``), so a path stays readable and unambiguous."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)


class _ArgumentError(Exception):
    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog, self.message = prog, message


@contextmanager
def _one_line_argparse() -> Iterator[None]:
    """While a command runs, argparse's error() raises instead of printing the usage block
    and exiting; ``--help`` still prints and exits 0. Every command's parser is covered,
    the workstation wheel's too, without changing how they are written."""
    def error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        raise _ArgumentError(self.prog, message)

    saved = argparse.ArgumentParser.error
    # patching the method for the command's run is the point (restored below)
    argparse.ArgumentParser.error = error  # type: ignore[method-assign]  # see above
    try:
        yield
    finally:
        argparse.ArgumentParser.error = saved  # type: ignore[method-assign]  # the original


# Commands of the device wheel that need no entry point (the signing commands): the
# dispatcher knows them, so a wheel built before they existed, or an editable install whose
# metadata predates them, still has them. An entry point of the same name wins.
BUILTIN_COMMANDS = {"sign": "edge_sdk.cli.signing:sign_main",
                    "keygen": "edge_sdk.cli.signing:keygen_main"}


class _Builtin:
    def __init__(self, target: str):
        self.target = target

    def load(self) -> Any:
        import importlib

        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


if __name__ == "__main__":
    sys.exit(main())
