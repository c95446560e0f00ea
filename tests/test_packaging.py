"""The two wheels built from this tree (packaging/build_wheels.py, `make wheels`), offline: what
each one holds and what it requires. The device wheel is ``edge_sdk`` and nothing else (the device
profiles inside it), and never requires torch; the workstation wheel adds trainer, exporters and
demos and pins the device wheel at its own version."""
from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("setuptools", minversion="70.1")  # bdist_wheel built in (the dev extra)
from packaging.requirements import Requirement  # noqa: E402 (pytest's own dependency)

import edge_sdk  # noqa: E402
from edge_sdk.cli import main as cli  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEVICE, WORKSTATION = "nested-edge-sdk", "nested-edge-sdk-workstation"
TORCH_SIDE = {"torch", "torchvision", "tqdm", "scikit-learn", "matplotlib"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("dist")
    res = subprocess.run([sys.executable, str(ROOT / "packaging" / "build_wheels.py"), str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    built = [Path(line) for line in res.stdout.split()]
    assert sorted(p.name for p in built) == sorted(p.name for p in out.glob("*.whl"))
    found = {}
    for p in built:
        z = zipfile.ZipFile(p)
        found[_metadata(z)["Name"]] = z
    assert set(found) == {DEVICE, WORKSTATION}
    return found


def _metadata(z: zipfile.ZipFile):
    (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
    return email.parser.Parser().parsestr(z.read(name).decode())


def _dist_file(z: zipfile.ZipFile, file: str) -> str:
    (name,) = [n for n in z.namelist() if n.endswith(f".dist-info/{file}")]
    return z.read(name).decode()


def _payload(z: zipfile.ZipFile) -> set[str]:
    return {n for n in z.namelist() if ".dist-info/" not in n}


def _sources(package: str, *patterns: str) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for pattern in patterns
            for p in (ROOT / package).rglob(pattern) if "__pycache__" not in p.parts}


def _requires(z: zipfile.ZipFile) -> list[Requirement]:
    return [Requirement(r) for r in _metadata(z).get_all("Requires-Dist") or []]


def _entry_points(z: zipfile.ZipFile, group: str) -> set[str]:
    text = _dist_file(z, "entry_points.txt")
    section = text.split(f"[{group}]")[1].split("\n[")[0] if f"[{group}]" in text else ""
    return {line.split("=")[0].strip() for line in section.splitlines() if "=" in line}


def test_device_wheel_is_edge_sdk_only_with_the_profiles_inside(wheels):
    z = wheels[DEVICE]
    files = _payload(z)
    assert {f.split("/")[0] for f in files} == {"edge_sdk"}
    assert _dist_file(z, "top_level.txt").split() == ["edge_sdk"]
    # every module of the package (pyproject lists the subpackages: none may be forgotten)
    assert _sources("edge_sdk", "*.py") <= files
    profiles = {f"edge_sdk/device_profiles/{p.name}" for p in (ROOT / "device_profiles").glob("*.yaml")}
    assert len(profiles) >= 5 and profiles <= files
    assert not {f for f in files if f.endswith(".yaml")} - profiles


def test_device_wheel_requires_no_torch_and_litert_where_it_has_wheels(wheels):
    z = wheels[DEVICE]
    reqs = _requires(z)
    assert not {r.name for r in reqs} & TORCH_SIDE  # not even in an extra
    assert {r.name for r in reqs if not r.marker or "extra" not in str(r.marker)} == {
        "numpy", "pyyaml", "psutil", "flatbuffers", "ai-edge-litert"}
    (litert,) = [r for r in reqs if r.name == "ai-edge-litert"]
    assert str(litert.specifier) == "==2.3.0"

    def env(platform, machine, python="3.11", extra=""):
        return {"sys_platform": platform, "platform_machine": machine,
                "python_version": python, "extra": extra}

    # ai-edge-litert 2.3.0 wheels: Linux x86_64/aarch64, macOS arm64, Windows amd64, Python 3.10-3.14
    for where in [env("linux", "x86_64"), env("linux", "aarch64", "3.14"), env("darwin", "arm64"),
                  env("win32", "AMD64", "3.10")]:
        assert litert.marker.evaluate(where), where
    for where in [env("darwin", "x86_64"), env("linux", "armv7l"), env("win32", "ARM64"),
                  env("linux", "x86_64", "3.15")]:
        assert not litert.marker.evaluate(where), where
    # the tflite-runtime extra: tflite-runtime 2.14.0 with numpy<2, Linux x86_64/aarch64, <= 3.11
    extra = {r.name: r for r in reqs if r.marker and "tflite-runtime" in str(r.marker)}
    assert set(extra) == {"tflite-runtime", "numpy"}
    assert str(extra["tflite-runtime"].specifier) == "==2.14.0"
    assert str(extra["numpy"].specifier) == "<2"
    for r in extra.values():
        assert r.marker.evaluate(env("linux", "aarch64", "3.11", "tflite-runtime"))
        for where in [env("linux", "x86_64", "3.12", "tflite-runtime"),
                      env("darwin", "arm64", "3.11", "tflite-runtime"),
                      env("win32", "AMD64", "3.11", "tflite-runtime"),
                      env("linux", "x86_64", "3.11")]:
            assert not r.marker.evaluate(where), where


def test_device_wheel_registers_the_device_commands_and_the_script(wheels):
    z = wheels[DEVICE]
    assert _entry_points(z, "edge_sdk.commands") == {"run", "bench", "profile", "materialize"}
    assert _entry_points(z, "console_scripts") == {"edge-sdk"}


def test_workstation_wheel_adds_trainer_exporters_demos_on_the_same_device_version(wheels):
    z = wheels[WORKSTATION]
    files = _payload(z)
    assert {f.split("/")[0] for f in files} == {"trainer", "exporters", "demos"}
    for package in ("trainer", "exporters", "demos"):
        assert _sources(package, "*.py") <= files
    assert _sources("trainer", "configs/*.yaml") <= files
    reqs = {r.name: r for r in _requires(z)}
    assert str(reqs[DEVICE].specifier) == f"=={edge_sdk.__version__}" and not reqs[DEVICE].marker
    assert TORCH_SIDE <= set(reqs) and str(reqs["torch"].specifier) == "==2.14.1"
    assert _entry_points(z, "edge_sdk.commands") == set(cli.WORKSTATION_COMMANDS)
    assert _entry_points(z, "console_scripts") == set()  # the script is the device wheel's


def test_one_version_and_the_names_the_cli_tells_users(wheels):
    versions = {name: _metadata(z)["Version"] for name, z in wheels.items()}
    assert versions == {DEVICE: edge_sdk.__version__, WORKSTATION: edge_sdk.__version__}
    assert (cli.DEVICE_DIST, cli.WORKSTATION_DIST) == (DEVICE, WORKSTATION)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    for toml in (ROOT / "pyproject.toml", ROOT / "packaging" / "workstation" / "pyproject.toml"):
        project = tomllib.loads(toml.read_text())["project"]
        assert project["version"] == edge_sdk.__version__, toml


def test_no_install_hint_names_the_taken_distribution():
    """`edge-sdk` on the package index is an unrelated project: every hint names ours."""
    taken = re.compile(r"pip install\s+['\"]?edge-sdk(?![-\w])|['\"]edge-sdk\[")
    offenders = []
    for pattern in ("*.py", "*.md", "*.toml", "Makefile", "run"):
        for p in ROOT.rglob(pattern):
            rel = p.relative_to(ROOT)
            if rel.parts[0] in (".venv", ".git", "runs", "build", "dist") or ".venv" in rel.parts[0]:
                continue
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if taken.search(line):
                    offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_both_wheels_carry_the_license_and_the_project_metadata(wheels):
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    for name, z in wheels.items():
        meta = _metadata(z)
        assert meta["License-Expression"] == "Apache-2.0", name
        (lic,) = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert z.read(lic).decode() == license_text, name
        urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
        assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls), name
        classifiers = meta.get_all("Classifier") or []
        assert "Programming Language :: Python :: 3 :: Only" in classifiers, name
        assert not [c for c in classifiers if c.startswith("License ::")], name  # SPDX instead
    assert "Typing :: Typed" in _metadata(wheels[DEVICE]).get_all("Classifier")


def test_device_wheel_ships_py_typed(wheels):
    assert "edge_sdk/py.typed" in _payload(wheels[DEVICE])


def test_the_changelog_keeps_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog")
    assert "keepachangelog.com" in text and "## [Unreleased]" in text
    assert re.search(r"^## \[0\.1\.0\] - \d{4}-\d{2}-\d{2}$", text, re.M)


def test_the_public_api_is_named_and_importable_from_edge_sdk():
    import inspect

    import edge_sdk.errors as errors

    assert {"load", "EdgeModel", "Budget", "Prediction", "EdgeSdkError", "InputError",
            "BundleError", "BudgetError", "BudgetNotMetError", "BackendError", "ProfileError",
            "ConfigError"} <= set(edge_sdk.__all__)
    for name in edge_sdk.__all__:
        assert getattr(edge_sdk, name) is not None, name
    assert set(edge_sdk.__all__) <= set(dir(edge_sdk))
    # every error class the SDK defines is public
    defined = {n for n, v in vars(errors).items()
               if inspect.isclass(v) and issubclass(v, Exception) and v.__module__ == errors.__name__}
    assert defined <= set(edge_sdk.__all__), defined - set(edge_sdk.__all__)
    assert issubclass(edge_sdk.BackendError, edge_sdk.EdgeSdkError)
    assert edge_sdk.load.__module__ == "edge_sdk.runtime.loading"
