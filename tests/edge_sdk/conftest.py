"""Shared device-side fixtures. Must not import torch at module level (the torch-free run)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from edge_sdk.bundle import MANIFEST_NAME

BUNDLE_ENV = "EDGE_SDK_TEST_BUNDLE"
QUIET = {"progress": False, "log": lambda *a: None}


@pytest.fixture(scope="session")
def bundle(tmp_path_factory) -> Path:
    """A real bundle exported from a tiny digits model trained in this session. Only this
    fixture needs torch: with ``EDGE_SDK_TEST_BUNDLE`` set it reuses the bundle at that path
    when it exists (the torch-free CI run) and otherwise exports it there (the main run)."""
    wanted = os.environ.get(BUNDLE_ENV)
    if wanted and (Path(wanted) / MANIFEST_NAME).is_file():
        return Path(wanted)
    pytest.importorskip("torch", exc_type=ImportError)  # absent, or made to fail
    from edge_sdk.bundle import SCOPES
    from exporters.export import ExportOptions, export_bundle
    from trainer.config import load_config
    from trainer.train import train

    work = tmp_path_factory.mktemp("runtime")
    cfg = load_config("digits", ["train.epochs=2", "train.eval_every=100",
                                 "data.calib_samples=64"])
    res = train(cfg, work / "run", **QUIET)
    out = Path(wanted) if wanted else work / "bundle"
    # layout files: these tests read the .tflite files of the directory (a store bundle's
    # slices are materialised: tests/edge_sdk/store)
    return Path(export_bundle(res.checkpoint, out, ExportOptions(
        widths=[0.5, 1.0], samples=2, scopes=SCOPES, measure=False, max_eval=50,
        layout="files"), **QUIET))


@pytest.fixture(scope="session", autouse=True)
def _private_profile_cache(tmp_path_factory):
    """load(profile="auto") reads measured profiles from a cache; the tests must never see the
    developer's real one (~/.cache/edge_sdk), so the session gets its own, empty."""
    old = os.environ.get("EDGE_SDK_CACHE")
    os.environ["EDGE_SDK_CACHE"] = str(tmp_path_factory.mktemp("edge_sdk_cache"))
    yield
    if old is None:
        os.environ.pop("EDGE_SDK_CACHE", None)
    else:
        os.environ["EDGE_SDK_CACHE"] = old
