"""Build both wheels from this tree, offline: ``python packaging/build_wheels.py [OUT_DIR]``.

  nested-edge-sdk              ../pyproject.toml: edge_sdk (+ device profiles as package data)
  nested-edge-sdk-workstation  workstation/pyproject.toml: trainer, exporters, demos (+ torch)

The sources are copied to a temporary directory first, so no ``build/`` or ``*.egg-info`` is left
in the working tree and no stale file from an earlier build can end up in a wheel. Uses the
running interpreter's pip and setuptools (``--no-build-isolation``: no network). Prints the
wheel paths, one per line.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the two build files read; everything else (tests, benchmarks, runs, .venv) stays out.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "edge_sdk", "device_profiles", "trainer", "exporters",
           "demos", "packaging")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def build(out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.whl"))
    with tempfile.TemporaryDirectory(prefix="edge-sdk-wheels-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in SOURCES:
            p = ROOT / name
            if p.is_dir():
                shutil.copytree(p, src / name, ignore=_IGNORE)
            else:
                shutil.copy2(p, src / name)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-cache-dir", "--disable-pip-version-check", "--quiet",
                        "--wheel-dir", str(out_dir), str(src), str(src / "packaging" / "workstation")],
                       check=True)
    return sorted(set(out_dir.glob("*.whl")) - before) or sorted(out_dir.glob("*.whl"))


if __name__ == "__main__":
    for wheel in build(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "dist")):
        print(wheel)
