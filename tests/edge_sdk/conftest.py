"""Shared device-side fixtures. Must not import torch at module level (the torch-free run)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from edge_sdk.bundle import MANIFEST_NAME

BUNDLE_ENV = "EDGE_SDK_TEST_BUNDLE"
QUIET = {"progress": False, "log": lambda *a: None}
# the shared bundle's precisions: float kernels only, what most device tests reason about; the
# dynamic-range and integer configurations have their own bundle (precision_bundle)
PRECISIONS = ("float",)


def _exported(wanted: str | None, suffix: str, tmp_path_factory, **options) -> Path:
    """A bundle exported from a tiny digits model trained once per session, at ``wanted`` +
    ``suffix`` when ``EDGE_SDK_TEST_BUNDLE`` names a path (kept there, and reused as it is by
    the torch-free runs), else in a temporary directory. Only exporting needs torch."""
    out = Path(wanted + suffix) if wanted else None
    if out is not None and (out / MANIFEST_NAME).is_file():
        return out
    pytest.importorskip("torch", exc_type=ImportError)  # absent, or made to fail
    from exporters.export import ExportOptions, export_bundle

    out = out or tmp_path_factory.mktemp("bundles") / f"bundle{suffix}"
    return Path(export_bundle(_checkpoint(tmp_path_factory), out,
                              ExportOptions(**options), **QUIET))


_CHECKPOINT: list[Path] = []


def _checkpoint(tmp_path_factory) -> Path:
    if not _CHECKPOINT:
        from trainer.config import load_config
        from trainer.train import train

        cfg = load_config("digits", ["train.epochs=2", "train.eval_every=100",
                                     "data.calib_samples=64"])
        _CHECKPOINT.append(train(cfg, tmp_path_factory.mktemp("runtime") / "run",
                                 **QUIET).checkpoint)
    return _CHECKPOINT[0]


@pytest.fixture(scope="session")
def bundle(tmp_path_factory) -> Path:
    """A real bundle exported from a tiny digits model trained in this session, layout files
    (these tests read the .tflite files of the directory; a store bundle's slices are
    materialised: tests/edge_sdk/store), float kernels only."""
    from edge_sdk.bundle import SCOPES

    return _exported(os.environ.get(BUNDLE_ENV), "", tmp_path_factory, widths=[0.5, 1.0],
                     samples=2, scopes=SCOPES, measure=False, max_eval=50, layout="files",
                     precisions=PRECISIONS)


@pytest.fixture(scope="session")
def precision_bundle(tmp_path_factory) -> Path:
    """The same model's store bundle with every precision of the point scope (float, dynamic
    range, int8: exporters.precision), latencies measured on this host."""
    return _exported(os.environ.get(BUNDLE_ENV), "-precisions", tmp_path_factory,
                     widths=[0.5, 1.0], scopes=("point",), max_eval=100, layout="store",
                     precisions=("float", "dynamic", "int8"))


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
