"""The workspace the documentation's code blocks run in (issue 34).

Every page reads as if typed at the top of a checkout after a short digits run, so the session
builds one such checkout once: a tiny digits model trained here (``runs/digits/checkpoint.pt``,
1 epoch), exported as the demo exports (``runs/demo/bundle``: store layout, point, head and all
scopes; and ``bundle/``, the plain-files layout the signing page signs), one test sample
(``x.npy``) and links to this checkout's ``.venv``, ``docs``, ``benchmarks`` and ``tests``.
Each page then gets its own copy, so pages do not depend on one another's order.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"progress": False, "log": lambda *a: None}
LINKED = (".venv", "docs", "benchmarks", "tests", "pyproject.toml", "Makefile", "packaging",
          "edge_sdk", "trainer", "exporters", "demos", "device_profiles", "README.md",
          "LICENSE")


def digits_test_split() -> tuple[np.ndarray, np.ndarray]:
    """Raw digits test images ``[N, 8, 8]`` (float32 in [0, 16], what the bundle takes) and
    labels, from the same deterministic split the digits config trains on."""
    from trainer.config import load_config
    from trainer.data import load_data

    test = load_data(load_config("digits").data).test
    return np.asarray(test.raw, np.float32)[..., 0], test.y.numpy()


def build_checkout(base: Path) -> Path:
    from edge_sdk.bundle import SCOPES
    from exporters.export import ExportOptions, export_bundle
    from trainer.config import load_config
    from trainer.train import train

    cfg = load_config("digits", ["train.epochs=1", "train.eval_every=100",
                                 "data.calib_samples=64"])
    ckpt = train(cfg, base / "runs" / "digits", **QUIET).checkpoint
    common = dict(widths=[0.5, 1.0], samples=2, scopes=SCOPES, max_eval=100)
    export_bundle(ckpt, base / "runs" / "demo" / "bundle",
                  ExportOptions(layout="store", **common), **QUIET)
    export_bundle(ckpt, base / "bundle", ExportOptions(layout="files", measure=False, **common),
                  **QUIET)
    xs, _ = digits_test_split()
    np.save(base / "x.npy", xs[-1])
    for name in LINKED:
        (base / name).symlink_to(ROOT / name)
    return base


def shell_env(checkout: Path) -> dict[str, str]:
    """What a shell block sees: this venv first on PATH (``edge-sdk``, ``python``, ``pip``),
    a private profile cache, no display."""
    venv_bin = str(Path(os.sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PATH=os.pathsep.join([venv_bin, env.get("PATH", "")]),
               EDGE_SDK_CACHE=str(checkout / ".cache"), MPLBACKEND="Agg",
               PYTHONDONTWRITEBYTECODE="1")
    return env
