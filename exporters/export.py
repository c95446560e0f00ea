"""Checkpoint -> bundle: per-width slices in three scopes, calibrated on validation, measured on
untouched test data, written atomically through ``edge_sdk.bundle``.

Scopes per width (docs/export.md):
  point  the posterior's point estimate (PWFN: codebook means; SQS: pruned greedy weights)
  head   the point backbone with S sampled classifiers stacked in one graph: [S, C] per invoke
  all    S fully sampled slices, each with its own BN statistics: S invokes

Layouts (docs/store.md §1): ``store`` (the default) writes one weight store
(:mod:`exporters.store`) and every slice is materialised from it by the device's own function,
with S a run-time choice (a head and an all configuration per S in
``ExportOptions.sample_counts``, by default 1, 2, 4, ... and S_max,
:func:`exporters.configs.store_width`); ``files`` writes one ``.tflite`` per file, S fixed.
Both are written by :mod:`exporters.layouts`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from edge_sdk.bundle import SCOPES, width_key
from edge_sdk.errors import ConfigError
# quality and slice_logits live with the configuration records; imported from here too
from exporters.configs import Configurations, EvalSets, quality, slice_logits  # noqa: F401
from trainer.device import resolve_device
from exporters.layouts import files_layout, store_layout, sample_counts
from exporters.precision import check_precisions
from exporters.slice import posterior_kind
from trainer import checkpoint as ckpt_io
from trainer.config import config_from_dict, config_to_dict
from trainer.data import load_data, load_ood, nhwc_inputs, training_view
from trainer.evaluate import batches
from trainer.layers import BayesNestedLayer


@dataclass
class ExportOptions:
    widths: Sequence[float] = (0.25, 0.5, 0.75, 1.0)
    samples: int = 8  # posterior samples per width for the head and all scopes (S_max)
    # which S get a head and an all configuration (store layout): None = the powers of two up
    # to S_max plus S_max (8 -> 1, 2, 4, 8; 6 -> 1, 2, 4, 6), "all" = 1 .. S_max, or a list of
    # integers in 1 .. S_max that includes S_max. Log-spaced by default: the all scope's latency
    # grows linearly in S while quality saturates, so the run-time choice keeps its range at
    # about half the manifest (docs/store.md §7: 68 -> 36 configurations for 4 widths
    # and S_max = 8; manifest 71,082 -> 45,667 B on Fashion-MNIST PWFN, bundle 1.72x -> 1.53x
    # of the point slice; digits Gaussian 65,189 -> 40,915 B). The all scope's sample files
    # (s0 .. s_{S_max-1}) are shared by every S anyway; head files exist for the listed S only.
    sample_counts: Sequence[int] | str | None = None
    # point (+ temperature) only by default: measured on cifar10_dev and Fashion-MNIST
    # (docs/results.md), posterior samples added <= 0.6 pt OOD AUROC over the point slice at S x
    # the cost; ("point", "head", "all") exports the sampled scopes for an app that wants them
    scopes: Sequence[str] = ("point",)
    weights: str = "dequantize"  # int8 per-channel + DEQUANTIZE, or "float"
    # the point slice's precisions, each a configuration of its own that the runtime's policy
    # picks by measured latency: float (the kernels of `weights`), dynamic (int8 weights,
    # activations quantized per invoke) and int8 (int8 kernels, activations calibrated per
    # width on the training split: exporters.precision); docs/export.md
    precisions: Sequence[str] = ("float", "dynamic", "int8")
    # "store" (docs/store.md): one weight store, every slice materialised from it;
    # "files": one .tflite per configuration file, for apps outside Python
    layout: str = "store"
    # sigma on a per-layer codebook of 2**sigma_bits log-spaced values (store layout, sampled
    # scopes): 4 bits measured within noise of exact sigma (docs/export.md, docs/store.md §2)
    sigma_bits: int = 4
    # a layer's sigma relative to its decoded weight (sigma / max(|mu|, step/2): sqrt(alpha))
    # on a 0- or 1-bit codebook where that is within this RMS log error, else the 4-bit
    # absolute codebook (exporters.sigma_code; docs/store.md §2, §7); None: always absolute
    sigma_rel_tol: float | None = 0.15
    # store.bin as the container's version 2 (deflated, docs/store.md §1) when that is smaller
    # (digits S_max = 8: -26 % Gaussian, -41 % PWFN); False: always version 1, for a device
    # whose edge_sdk predates version 2
    compress_store: bool = True
    targets: Sequence[float] = (0.9, 0.95, 0.99)  # accuracies the thresholds are fitted for
    # accuracy a two-stage cascade may give up against always running the wider configuration
    # (validation); 0.2 pt keeps the test-set loss inside the runtime's goal of at most 0.3 pt
    cascade_max_loss: float = 0.002
    measure: bool = True  # host latency and memory (tests switch it off)
    force: bool = False  # replace an existing bundle
    seed: int = 0
    calib_data: str | None = None  # BN re-collection source; default: the training split
    eval_data: str | None = None  # default: the checkpoint's own test split
    ood_data: str | None = None
    max_eval: int | None = None  # cap on evaluated samples (quick runs, tests)
    # where BN statistics are re-collected (auto = CUDA when available, else CPU)
    device: str = "auto"
    extra_source: dict = field(default_factory=dict)
    # uncertainty.bin: per width an out-of-distribution score (KNN, k = 10, on the
    # slice's features; each slice gets them as a second output) and per configuration
    # conformal quantiles (exporters.uncertainty); needs the point scope
    uncertainty: bool = True
    # the training split's per-channel raw statistics in the manifest, so the
    # runtime flags inputs unlike the training data (Prediction.input_suspect)
    input_stats: bool = True
    # the OOD score and its bank (exporters.uncertainty.OodBank: the screen's pick,
    # docs/uncertainty.md "The bank screen")
    ood_bank: Any = None


def snapped_widths(model, widths: Sequence[float], log=print) -> list[float]:
    """The widths the slices really have, duplicates dropped, so the manifest never misstates
    what a file runs.

    A width ``w`` cuts every ordering unit at its own group boundary: ``ceil(w * G_u)`` of its
    ``G_u`` groups, exactly what training's ``model.width(w)`` runs (export used to
    cut every unit at the coarsest unit's boundary, so a model with one unit of 2 groups
    exported its "0.25" slice at 0.5 everywhere). The recorded width is the smallest share any
    unit keeps, ``min_u ceil(w * G_u) / G_u``: the largest width that cuts every unit the same
    way, so it names the network uniquely (any ``w'`` between ``w`` and it gives the same cuts)
    and every unit keeps at least that share of its groups. For uniform group counts this is
    the old snap (0.3 with 8 groups: 0.375). Units that keep more are named in the log; the
    configuration's ``macs`` states the slice's real cost."""
    units = model.orderings()
    names = {id(u): n for n, m in model.named_modules()
             if isinstance(m, BayesNestedLayer) for u in [m.ordering] if u is not None}
    out: list[float] = []
    for w in widths:
        model.check_width(w)  # ConfigError below the frozen groups or outside (0, 1]
        kept = [u.groups_for_width(w) for u in units]
        real = min((k / u.groups for k, u in zip(kept, units)), default=1.0)
        # the recorded width must cut every unit exactly as w does
        assert [u.groups_for_width(real) for u in units] == kept, (w, real)
        if real in out:
            log(f"width {w:g} is the same network as width {real:g}: exported once")
            continue
        clash = [o for o in out if width_key(o) == width_key(real)]
        if clash:  # the store, the graphs and the configuration ids key a width by %.2f
            raise ConfigError(f"widths {clash[0]:g} and {real:g} (asked {w:g}) are different "
                              f"networks with the same key {width_key(real)!r}; drop one")
        if abs(real - w) > 1e-9:
            log(f"width {w:g} recorded as {real:g}: the narrowest unit's group boundary")
        more = [(names.get(id(u), "?"), k, u.groups) for k, u in zip(kept, units)
                if k / u.groups > real + 1e-9]
        if more:
            shown = ", ".join(f"{n} {k}/{g}" for n, k, g in more[:4])
            log(f"width {real:g}: {len(more)} of {len(units)} nested units keep more than "
                f"{real:g} of their groups, at their own group boundary ({shown}"
                f"{', ...' if len(more) > 4 else ''})")
        out.append(real)
    return out


def _compression(ckpt: dict, kind: str) -> dict:
    m = ckpt.get("metrics") or {}
    if kind == "pwfn":
        q = m.get("pwfn", {})
        return {"unique_values": q.get("unique_values"), "entropy_bits": q.get("entropy_bits"),
                "packed_checkpoint_bytes": q.get("packed_bytes")}
    if kind == "sqs":
        q = m.get("sqs", {})
        return {"paper_rate": q.get("rate"), "bits_per_weight": q.get("bits_per_weight"),
                "packed_checkpoint_bytes": q.get("packed_bytes")}
    return {}


def export_bundle(checkpoint: str | Path, out: str | Path, opts: ExportOptions | None = None,
                  *, progress: bool = True, log=print) -> Path:
    """Write the bundle for ``checkpoint`` into ``out``; return its path."""
    from edge_sdk import bundle as B

    opts = opts or ExportOptions()
    bad = sorted(set(opts.scopes) - set(SCOPES))
    if bad or not opts.scopes:
        raise ConfigError(f"scopes must be a non-empty subset of {', '.join(SCOPES)}, got {bad}")
    if not isinstance(opts.samples, int) or opts.samples < 1:
        raise ConfigError(f"samples must be an integer >= 1 (posterior samples per width), got "
                          f"{opts.samples!r}")
    sample_counts(opts.samples, opts.sample_counts)  # ConfigError naming a bad value
    if opts.layout not in B.BUNDLE_LAYOUTS:
        raise ConfigError(f"layout must be one of {', '.join(B.BUNDLE_LAYOUTS)}, got "
                          f"{opts.layout!r}")
    if not isinstance(opts.sigma_bits, int) or not 1 <= opts.sigma_bits <= 8:
        raise ConfigError(f"sigma_bits must be an integer in [1, 8], got {opts.sigma_bits!r}")
    opts.precisions = check_precisions(opts.precisions)  # (point configurations only)
    if not 0 <= opts.cascade_max_loss <= 1:
        raise ConfigError(f"cascade_max_loss must be an accuracy difference in [0, 1], got "
                          f"{opts.cascade_max_loss!r}")
    # The whole export holds the target's lock (a second export to it fails at once), and
    # under it what a killed export left beside the target is recovered first.
    with B.ExportLock(out) as lock:
        for line in lock.recovered:
            log(line)
        return _export_locked(checkpoint, out, opts, lock, progress, log)


def _export_locked(checkpoint, out, opts: ExportOptions, lock, progress: bool, log) -> Path:
    from edge_sdk import bundle as B

    if Path(out).exists() and not opts.force:
        raise B.BundleError(f"{out} exists; pass --force to replace it")
    device = resolve_device(opts.device)
    torch.manual_seed(opts.seed)
    ckpt = ckpt_io.load_checkpoint(checkpoint)
    kind = posterior_kind(ckpt)
    if opts.layout == "store" and opts.weights == "float" and kind == "gaussian":
        # the store keeps a gaussian posterior's means as int8 codes
        # (exporters.store._layer_arrays): its slices would not be fp32, whatever the manifest said
        raise ConfigError("--weights float: the store layout keeps a gaussian posterior's "
                          "weights as int8 codes, so its slices would not be fp32; use --layout "
                          "files --weights float, or --weights dequantize with the store")
    cfg = config_from_dict(ckpt["config"])
    model = ckpt_io.model_from_checkpoint(ckpt)
    widths = snapped_widths(model, opts.widths, log)
    # the spec training normalised with, carried by the checkpoint; the reloaded data must
    # match it (InputSpecMismatchError naming both values otherwise)
    spec = ckpt_io.input_spec(ckpt)
    data = load_data(cfg.data, spec)
    calib_ds = data.train if opts.calib_data is None else load_ood(opts.calib_data, spec)
    calib = batches(calib_ds, min(cfg.data.calib_samples, len(calib_ds)), cfg.seed, batch=256)
    val_x, val_y = nhwc_inputs(data.val, opts.max_eval)
    test_ds = data.test if opts.eval_data is None else load_ood(opts.eval_data, spec, labels=True)
    test_x, test_y = nhwc_inputs(test_ds, opts.max_eval)
    ood_x = None
    if opts.ood_data is not None:
        ood_x, _ = nhwc_inputs(load_ood(opts.ood_data, spec), opts.max_eval)
    shape = list(spec.shape)
    classes = len(spec.classes)
    ev = EvalSets(val_x, val_y, test_x, test_y, ood_x)
    out_cfg = Configurations(ev, opts.targets, opts.weights, opts.measure, classes)
    sampled = bool({"head", "all"} & set(opts.scopes))
    extra: dict = {}
    if opts.layout == "store":
        files, weight_notes = store_layout(model, ckpt, kind, widths, calib, shape, opts,
                                           out_cfg, device, sampled, progress, extra)
    else:
        files, weight_notes = files_layout(model, ckpt, kind, widths, calib, shape, opts,
                                           out_cfg, device, sampled, progress)
    configs = out_cfg.finish(opts.cascade_max_loss)
    unc_report = None
    # the training split as arrays (a photo folder's: a seeded sample, trainer.data.TRAINING_VIEW)
    train_view = training_view(data.train, cfg.seed) if opts.uncertainty or opts.input_stats else None
    if opts.uncertainty:
        entry, blob, unc_report = _uncertainty(out_cfg, configs, train_view, opts, log)
        if entry is not None:
            extra["uncertainty"] = entry
            files[entry["name"]] = blob
    if opts.input_stats:  # input_suspect: the training split's raw statistics
        from exporters.input_stats import fit_input_stats

        extra["input_stats"] = fit_input_stats(train_view.raw, spec.value_range)
    sd = spec.to_dict()
    manifest = B.Manifest.from_dict({
        "schema_version": B.SCHEMA_VERSION, "layout": opts.layout, **extra,
        "input": {k: sd[k] for k in ("shape", "layout", "dtype", "value_range", "mean", "std",
                                     "preprocess") if k in sd},  # preprocess: when recorded
        "labels": list(spec.classes),
        "source": {"checkpoint": Path(checkpoint).name,
                   "checkpoint_sha256": hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest(),
                   "posterior": kind, "architecture": ckpt["arch"]["name"],
                   "eval_data": opts.eval_data or "test split", "ood_data": opts.ood_data,
                   "calib_data": opts.calib_data or "training split",
                   # the checkpoint's data config and the evaluation cap, so `edge-sdk report`
                   # can rebuild the identical test split (trainer.data.load_data)
                   "data": config_to_dict(cfg)["data"], "max_eval": opts.max_eval,
                   # compression three ways, never conflated: the quantizer's own figures here,
                   # the .tflite bytes in each configuration's files
                   "compression": _compression(ckpt, kind),
                   # per configuration: tensors kept float because the int8 grid could not be
                   # exact (PWFN), and the largest relative move the int8 grid made
                   "weights": weight_notes,
                   # the OOD score and conformal sets per width, measured on the
                   # test split (and the OOD set when given)
                   **({"uncertainty": unc_report} if unc_report else {}),
                   **opts.extra_source},
        # the slices' flatten and head reshapes infer the batch (-1): one invoke may run N
        "batch_dim": 0,
        "configurations": configs})
    path = B.write_bundle(out, manifest, files, force=opts.force, lock=lock)
    log(summary(manifest))
    return path


def _uncertainty(out_cfg, configs, train_ds, opts: ExportOptions, log):
    """(manifest entry, bytes, report) of ``uncertainty.bin``, or Nones without point scope."""
    from edge_sdk import bundle as B
    from edge_sdk.answers.uncertainty import FILE_NAME
    from exporters.uncertainty import OodBank, fit_uncertainty

    # the bank and its threshold from each width's float point slice, shared by the width's
    # other precisions (each scores its own features)
    points = {width_key(r["width"]): (r["id"], out_cfg.bufs[r["id"]][0])
              for r in configs if r["scope"] == "point" and r["weights"] == opts.weights}
    if not points:
        log("uncertainty: no point scope exported, so no OOD score or conformal sets")
        return None, None, None
    # the whole training split: the prototypes summarise it (the bank's bytes do not grow)
    ty = train_ds.y.numpy()
    tx = train_ds.x.permute(0, 2, 3, 1).contiguous().numpy()
    blob, report = fit_uncertainty(configs, out_cfg.val_probs, points, (tx, ty), out_cfg.ev,
                                   bank=opts.ood_bank or OodBank(), seed=opts.seed, log=log)
    return B.file_entry(FILE_NAME, blob).to_dict(), blob, report


def bundle_bytes(bundle_dir: str | Path) -> int:
    """Every byte in a bundle directory (the bundle's size: store.bin + manifest.yaml +
    anything else, hidden files and subdirectories included; symlinks are not followed)."""
    root = Path(bundle_dir)
    if not root.is_dir():
        raise ConfigError(f"{root}: not a bundle directory")
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def summary(manifest) -> str:
    lines = [f"{'configuration':<16}{'acc':>7}{'acc T':>7}{'ece':>7}{'ece T':>7}{'T':>6}"
             f"{'MACs':>10}{'KiB':>8}{'ms':>8}{'MB':>7}"]
    for c in manifest.configurations:
        raw, cal = c.test["raw"], c.test["calibrated"]
        kib = sum(f.bytes for f in c.files) / 1024
        ms = "-" if c.latency_ms is None else f"{c.latency_ms:.3f}"
        mb = "-" if c.memory_mb is None else f"{c.memory_mb:.1f}"
        lines.append(f"{c.id:<16}{raw['accuracy']:>7.4f}{cal['accuracy']:>7.4f}{raw['ece']:>7.4f}"
                     f"{cal['ece']:>7.4f}{c.temperature:>6.2f}{c.macs:>10}{kib:>8.1f}{ms:>8}{mb:>7}")
    return "\n".join(lines)
