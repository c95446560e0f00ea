"""``edge-sdk export``: checkpoint -> bundle (registered under ``edge_sdk.commands``)."""
from __future__ import annotations

import argparse
import sys
import warnings


def _floats(text: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")


def _sample_counts(text: str) -> str | list[int]:
    if text.strip() == "all":
        return "all"
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or comma-separated integers, got "
                                         f"{text!r}")


def _quiet_interpreter_log() -> None:
    """The exporters run LiteRT directly (exporters.measure): spend its once-per-process
    XNNPACK INFO line out of sight, as edge_sdk's backends do for the device commands."""
    from ai_edge_litert.interpreter import Interpreter

    from edge_sdk.backends import quiet_delegate_banner

    quiet_delegate_banner(Interpreter)


def export_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk export",
        description="Cut a trained or quantized checkpoint into per-width TFLite slices (point, "
                    "sampled-head and fully sampled scopes), calibrate them on the validation "
                    "split, measure them on test data and write a bundle. The last line "
                    "printed is the bundle path.")
    p.add_argument("checkpoint")
    p.add_argument("--out", required=True, help="bundle directory to create")
    p.add_argument("--widths", type=_floats, default=[0.25, 0.5, 0.75, 1.0])
    p.add_argument("--samples", type=int, default=8,
                   help="posterior samples per width (S_max; store layout: the S in "
                        "--sample-counts are configurations)")
    p.add_argument("--sample-counts", type=_sample_counts, default=None,
                   help="store layout: the S that get a head and an all configuration, e.g. "
                        "1,2,4,8 (must include --samples), or 'all' for every S in 1..S_max "
                        "(default: powers of two up to S_max, plus S_max)")
    p.add_argument("--layout", choices=["store", "files"], default="store",
                   help="store (default): one weight store, slices materialised on the device "
                        "(docs/store.md); files: one .tflite per slice, for apps outside Python")
    p.add_argument("--scope", default="point",
                   help="comma-separated subset of point,head,all (default point: on the "
                        "Fashion-MNIST and CIFAR-10 benchmarks posterior samples added <= 0.6 pt "
                        "OOD AUROC at S x the cost, docs/results.md)")
    p.add_argument("--weights", choices=["dequantize", "hybrid", "float"], default="dequantize",
                   help="int8 weights via DEQUANTIZE (exact, default), as hybrid int8 ops, or float")
    p.add_argument("--precisions", default="float,dynamic,int8",
                   help="comma-separated subset of float,dynamic,int8 (float required): the point "
                        "slice's kernels, each its own configuration the runtime picks among by "
                        "measured latency (default: all three)")
    p.add_argument("--calib-data", default=None,
                   help="data source for BN re-collection (default: the training split)")
    p.add_argument("--eval-data", default=None,
                   help="data source for the test metrics (default: the checkpoint's test split)")
    p.add_argument("--ood-data", default=None,
                   help="out-of-distribution source for OOD AUROC, e.g. npz:notmnist_test.npz")
    p.add_argument("--max-eval", type=int, default=None, help="cap evaluated samples per split")
    p.add_argument("--cascade-max-loss", type=float, default=0.002,
                   help="accuracy a two-stage cascade may lose against the wider configuration "
                        "on validation (default 0.002 = 0.2 pt)")
    p.add_argument("--no-uncertainty", action="store_true",
                   help="no uncertainty.bin: answers carry no OOD score and no prediction set "
                        "(and slices have no features output)")
    p.add_argument("--no-input-stats", action="store_true",
                   help="no input_stats in the manifest: answers carry input_suspect None "
                        "(no check of a sample's raw statistics against the training split)")
    p.add_argument("--ood-score", choices=["knn", "energy+knn"], default=None,
                   help="the OOD score (default: the screen's pick, docs/uncertainty.md)")
    p.add_argument("--ood-prototypes", type=int, default=None,
                   help="bank prototypes per class and width (bytes: classes x this x "
                        "feature dim per width, before deflate)")
    p.add_argument("--ood-bits", type=int, default=None, help="bits per bank value (2..8)")
    p.add_argument("--no-measure", action="store_true", help="skip latency and memory runs")
    p.add_argument("--force", action="store_true", help="replace an existing bundle")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto",
                   help="where BN statistics are re-collected (auto: CUDA if available, else CPU)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.samples < 1:
        p.error("--samples must be >= 1")

    from exporters.export import ExportOptions, export_bundle
    from exporters.uncertainty import OodBank

    def _ood_bank(a: argparse.Namespace) -> OodBank:
        d = OodBank()
        return OodBank(a.ood_score or d.score, a.ood_prototypes or d.per_class,
                       a.ood_bits or d.bits)

    _quiet_interpreter_log()
    opts = ExportOptions(widths=args.widths, samples=args.samples,
                         sample_counts=args.sample_counts,
                         scopes=[s.strip() for s in args.scope.split(",") if s.strip()],
                         weights=args.weights, measure=not args.no_measure, force=args.force,
                         precisions=[s.strip() for s in args.precisions.split(",") if s.strip()],
                         calib_data=args.calib_data, eval_data=args.eval_data,
                         ood_data=args.ood_data, cascade_max_loss=args.cascade_max_loss,
                         max_eval=args.max_eval, device=args.device, layout=args.layout,
                         uncertainty=not args.no_uncertainty, ood_bank=_ood_bank(args),
                         input_stats=not args.no_input_stats)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_calibration_warning(warnings.showwarning)
        print(export_bundle(args.checkpoint, args.out, opts, progress=not args.no_progress))
    return 0


def _one_line_calibration_warning(show):
    """A CalibrationWarning is advice about the user's data, not about our code: printed as one
    ``warning: ...`` line without a source location, once per message (Python's own once-per-
    location registry is reset whenever anything touches the warning filters, as tracing a
    model with torch.fx does); other warnings go to ``show``."""
    from exporters.calibrate import CalibrationWarning

    said: set[str] = set()

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, CalibrationWarning):
            if str(message) not in said:
                said.add(str(message))
                print(f"warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return showwarning


def report_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk report",
        description="Write a Markdown report with PNG figures for a bundle: a per-configuration "
                    "table (accuracy, NLL, ECE, Brier, OOD AUROC, MACs, bytes, unique weight "
                    "values, latency, memory, temperature), reliability diagrams, accuracy and "
                    "ECE against width, risk-coverage curves with the exported thresholds, and "
                    "the budget trace when given. Every configuration's .tflite files are run "
                    "on the evaluation data. The last line printed is the report path.")
    p.add_argument("bundle")
    p.add_argument("--eval-data", default=None,
                   help="data source to evaluate on (default: the data the bundle was "
                        "evaluated on, e.g. the checkpoint's test split)")
    p.add_argument("--ood-data", default=None,
                   help="out-of-distribution source for OOD AUROC (default: the bundle's)")
    p.add_argument("--trace", default=None,
                   help="budget-trace JSON written by the demo ({\"records\": [...]})")
    p.add_argument("--out", default=None,
                   help="report directory (default: <bundle>/../<bundle name>-report)")
    p.add_argument("--max-eval", type=int, default=None,
                   help="cap evaluated samples per data set (default: the bundle's cap when "
                        "evaluating its own data, else all)")
    args = p.parse_args(argv)
    if args.max_eval is not None and args.max_eval < 1:
        p.error("--max-eval must be >= 1")

    from exporters.report import write_report

    _quiet_interpreter_log()

    write_report(args.bundle, args.out, eval_data=args.eval_data, ood_data=args.ood_data,
                 trace=args.trace, max_eval=args.max_eval)
    return 0
