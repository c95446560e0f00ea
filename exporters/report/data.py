"""The report's evaluation: the bundle's evaluation (and OOD) data rebuilt, every
configuration's ``.tflite`` files run on it in the LiteRT interpreter.

Per-sample numbers come from running each configuration's ``.tflite`` files on the evaluation
data exactly as the exporter measured them: logits / the configuration's temperature, softmax,
averaged over posterior samples. Evaluation data: an explicit source, else the source the bundle
was evaluated on (the checkpoint's test split, rebuilt from the data config the exporter records
in ``source.data``, capped at the recorded ``source.max_eval``); OOD data likewise.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edge_sdk.bundle import Configuration, InputSpec, Manifest, resolve_file
from edge_sdk.errors import BundleError, ConfigError, DataError, EdgeSdkError

__all__ = ["ConfigResult", "EvalData", "evaluate_configuration", "load_eval_data"]


@dataclass(frozen=True, eq=False)
class EvalData:
    """NHWC model inputs (already normalised) and labels of the evaluation (and OOD) data."""

    x: np.ndarray  # [N, H, W, C] float32
    y: np.ndarray  # [N] class indices
    description: str
    same_as_manifest: bool  # the data (and cap) the manifest's test metrics were measured on
    ood_x: np.ndarray | None = None
    ood_description: str | None = None


@dataclass(frozen=True, eq=False)
class ConfigResult:
    """One configuration run on :class:`EvalData`."""

    probs: np.ndarray  # [N, C] mean over samples of softmax(logits / temperature)
    metrics: dict[str, float]  # accuracy, nll, brier, ece, mutual_info[, ood_auroc]; calibrated
    raw_metrics: dict[str, float]  # the same at temperature 1

    @property
    def confidence(self) -> np.ndarray:
        return self.probs.max(axis=1)

    def correct(self, labels: np.ndarray) -> np.ndarray:
        return self.probs.argmax(axis=1) == labels


def _input_spec(manifest: Manifest) -> InputSpec:
    """The manifest's input spec with its labels as the classes: what the data must match."""
    return replace(manifest.input, classes=tuple(manifest.labels))


def load_eval_data(manifest: Manifest, eval_data: str | None = None,
                   ood_data: str | None = None, max_eval: int | None = None,
                   log=print) -> EvalData:
    """The evaluation data for ``manifest``'s bundle.

    ``eval_data`` (a trainer.data source, loaded like ``edge-sdk export --eval-data``) or else
    the data the manifest was measured on: the ``--eval-data`` source recorded in
    ``source.eval_data``, or the checkpoint's test split rebuilt from ``source.data`` with
    ``trainer.data.load_data`` (same source and split seed: the identical samples). Without an
    explicit ``max_eval`` the recorded cap is applied to the recorded data. ``ood_data`` else
    ``source.ood_data`` (skipped with a warning when that recorded source no longer loads).
    """
    from trainer.config import config_from_dict
    from trainer.data import load_data, load_ood, nhwc_inputs

    if max_eval is not None and (isinstance(max_eval, bool) or not isinstance(max_eval, int)
                                 or max_eval < 1):
        raise ConfigError(f"max_eval must be an integer >= 1 (samples per data set), "
                          f"got {max_eval!r}")
    src = manifest.source
    spec = _input_spec(manifest)
    recorded = src.get("eval_data", "test split")
    recorded = recorded if isinstance(recorded, str) and recorded != "test split" else None
    same = eval_data is None or eval_data == recorded
    if same and max_eval is None:
        max_eval = src.get("max_eval") if isinstance(src.get("max_eval"), int) else None
    cap = "" if max_eval is None else f", first {max_eval} samples"
    source = eval_data if eval_data is not None else recorded
    if source is not None:
        ds = load_ood(source, spec, labels=True)  # evaluation needs labels; OOD data does not
        description = f"`{source}`{cap}"
    else:
        data_cfg = src.get("data")
        if not isinstance(data_cfg, Mapping):
            raise BundleError(
                "the manifest does not record the data the bundle was evaluated on (source.data "
                "is missing: a bundle exported before `edge-sdk report` existed); pass the "
                "evaluation data explicitly, e.g. --eval-data digits")
        try:
            cfg = config_from_dict({"data": dict(data_cfg)}).data
        except ConfigError as exc:
            raise BundleError(f"manifest source.data is not a valid data config: {exc}") from None
        splits = load_data(cfg)
        diffs = spec.mismatches(splits.spec)
        if diffs:
            listed = "; ".join(f"{name} {a} in the bundle, {b} now" for name, a, b in diffs)
            log(f"warning: the training split of {cfg.source!r} no longer has the input spec "
                f"the bundle was exported with ({listed}); the data changed since the export, "
                "so the recomputed numbers are not on the exported test split")
            same = False
        ds = splits.test
        description = f"test split of `{cfg.source}` (split seed {cfg.split_seed}){cap}"
    x, y = nhwc_inputs(ds, max_eval)
    if y.min() < 0 or y.max() >= len(manifest.labels):
        raise DataError(f"evaluation data {description}: labels must be class indices in "
                        f"[0, {len(manifest.labels)}) (the bundle's labels), got values in "
                        f"[{y.min()}, {y.max()}]")
    ood_x = ood_desc = None
    ood_source = ood_data if ood_data is not None else src.get("ood_data")
    if ood_source is not None:
        try:
            ood_x, _ = nhwc_inputs(load_ood(str(ood_source), spec), max_eval)
            ood_desc = f"`{ood_source}`{cap}"
        except (EdgeSdkError, OSError) as exc:
            if ood_data is not None:
                raise
            log(f"warning: skipping the OOD data recorded in the manifest ({ood_source!r}): "
                f"{exc}")
    return EvalData(x=x, y=y, description=description, same_as_manifest=same,
                    ood_x=ood_x, ood_description=ood_desc)


_SOURCES: dict = {}  # bundle dir -> (manifest mtime, verified slice source): one store read


def _config_logits(bundle_dir: Path, config: Configuration, xs: np.ndarray) -> np.ndarray:
    """[S, N, C] logits of ``config`` on NHWC inputs, through the interpreter; a store bundle's
    files are materialised from its verified store."""
    from edge_sdk.bundle import MANIFEST_NAME, read_manifest
    from edge_sdk.store.sources import open_slices
    from exporters.export import slice_logits

    key = str(Path(bundle_dir).resolve())
    stamp = (Path(bundle_dir) / MANIFEST_NAME).stat().st_mtime_ns
    if key not in _SOURCES or _SOURCES[key][0] != stamp:
        manifest = read_manifest(bundle_dir, verify=False)
        if manifest.layout != "store":
            bufs = [resolve_file(bundle_dir, f.name).read_bytes() for f in config.files]
            return slice_logits(bufs, config.scope, xs)
        _SOURCES[key] = (stamp, open_slices(bundle_dir, manifest))
    source = _SOURCES[key][1]
    return slice_logits([source[f.name] for f in config.files], config.scope, xs)


def evaluate_configuration(bundle_dir: str | os.PathLike, config: Configuration,
                           data: EvalData) -> ConfigResult:
    """Run ``config``'s files on ``data`` (and its OOD inputs in the same interpreter pass)."""
    from exporters.export import quality

    xs = data.x if data.ood_x is None else np.concatenate([data.x, data.ood_x])
    logits = _config_logits(Path(bundle_dir), config, xs)
    n = len(data.x)
    ood = None if data.ood_x is None else logits[:, n:]
    probs, cal = quality(logits[:, :n], data.y, config.temperature, ood)
    _, raw = quality(logits[:, :n], data.y, 1.0, ood)
    return ConfigResult(probs=probs, metrics=cal, raw_metrics=raw)
