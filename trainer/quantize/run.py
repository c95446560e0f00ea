"""Run a quantizer on a trained model or checkpoint and write the quantized checkpoint."""
from __future__ import annotations

import os
from pathlib import Path

from edge_sdk.errors import CheckpointError, ConfigError
from trainer import checkpoint as ckpt_io
from trainer.config import Config, config_from_dict, config_to_dict
from trainer.data import DataSplits, load_data
from trainer.device import resolve_device
from trainer.models import NestedModel

METHODS = ("pwfn", "sqs")


def default_out_dir(checkpoint: str | os.PathLike, method: str) -> Path:
    """``runs/<run name>-<method>/``: a checkpoint called checkpoint.pt is named by its run dir."""
    p = Path(checkpoint)
    stem = p.parent.name if p.stem == "checkpoint" and p.parent.name else p.stem
    return Path("runs") / f"{stem}-{method}"


def quantize_model(model: NestedModel, cfg: Config, data: DataSplits, out_dir: str | os.PathLike,
                   *, base_metrics: dict | None = None, progress: bool = True, log=print) -> Path:
    """Quantize ``model`` in place with ``cfg.quantize.method`` and write ``out_dir/checkpoint.pt``."""
    method = cfg.quantize.method
    if method not in METHODS:
        raise ConfigError(f"quantize.method must be one of {', '.join(METHODS)}, got {method!r}")
    metrics = dict(base_metrics or {})
    model.to(resolve_device(cfg.train.device))  # fine-tuning runs where training did
    keyed = lambda res: {f"{w:g}": row for w, row in res.items()}  # noqa: E731
    if method == "pwfn":
        from trainer.quantize.pwfn import fix_weights_

        result = fix_weights_(model, cfg.quantize.pwfn, data, cfg, progress=progress, log=log)
        metrics["pwfn"] = {"before": keyed(result.before), "point": keyed(result.after_point),
                           "ensemble": keyed(result.after_ensemble),
                           "unique_values": result.unique_values,
                           "entropy_bits": result.entropy_bits,
                           "packed_bytes": result.packed_bytes}
        table = _table("PWFN: {} unique values network-wide, weight entropy {:.3f} bits, packed "
                       "{} bytes".format(result.unique_values, result.entropy_bits,
                                         result.packed_bytes),
                       result.before, result.after_point, result.after_ensemble)
    else:
        from trainer.quantize.sqs import sqs_

        result = sqs_(model, cfg.quantize.sqs, data, cfg, progress=progress, log=log)
        metrics["sqs"] = {"before": keyed(result.before), "greedy": keyed(result.greedy),
                          "bayes": keyed(result.bayes), "rate": result.rate,
                          "bits_per_weight": result.bits_per_weight,
                          "packed_bytes": result.packed_bytes,
                          "nonzero_kept": result.nonzero_kept,
                          "total_weights": result.total_weights,
                          "uncertain_fraction": result.uncertain_fraction}
        table = _table("SQS: {}/{} weights kept, paper rate {:.1f}x, real {:.2f} bits/weight, "
                       "packed {} bytes, max phi < 0.99 for {}".format(
                           result.nonzero_kept, result.total_weights, result.rate,
                           result.bits_per_weight, result.packed_bytes,
                           {k: round(v, 4) for k, v in result.uncertain_fraction.items()}),
                       result.before, result.greedy, result.bayes)
    ckpt = ckpt_io.build_checkpoint(model, input_spec=data.spec.to_dict(),
                                    config=config_to_dict(cfg), split_seed=data.split_seed,
                                    metrics=metrics, posterior=result.posterior)
    path = ckpt_io.save_checkpoint(ckpt, Path(out_dir) / "checkpoint.pt")
    log(table)
    return path


def quantize_checkpoint(checkpoint: str | os.PathLike, cfg: Config | None = None,
                        out_dir: str | os.PathLike | None = None, *, progress: bool = True,
                        log=print) -> Path:
    """Quantize an existing checkpoint; data and training settings come from the checkpoint's
    own config (same split seed), the quantizer settings from ``cfg`` when given."""
    state = ckpt_io.load_checkpoint(checkpoint)
    if state.get("posterior", {}).get("kind") != "gaussian":
        raise CheckpointError(f"{checkpoint} is already quantized "
                              f"({state['posterior'].get('kind')}); quantize the trained one")
    trained = config_from_dict(state["config"])
    if cfg is not None:
        trained.quantize = cfg.quantize
    model = ckpt_io.model_from_checkpoint(state)
    # the data reloaded against the spec training normalised with (InputSpecMismatchError if
    # they changed since), which the quantized checkpoint then carries on
    data = load_data(trained.data, ckpt_io.input_spec(state))
    out = Path(out_dir) if out_dir else default_out_dir(checkpoint, trained.quantize.method)
    return quantize_model(model, trained, data, out, base_metrics=state.get("metrics"),
                          progress=progress, log=log)


def _table(title: str, before: dict, point: dict, sampled: dict) -> str:
    """Per-width accuracy and ECE: before quantization, point network, sampled ensemble
    (``-`` where the ensemble was not evaluated: SQS with ``samples: 0``)."""
    lines = [title, f"{'width':>6} {'acc before':>11} {'acc point':>10} {'acc ens':>9} "
                    f"{'ece before':>11} {'ece point':>10} {'ece ens':>9}"]
    for w in sorted(point):
        b, p, e = before[w], point[w], sampled.get(w)
        ens = (f"{e['accuracy']:>9.4f}", f"{e['ece']:>9.4f}") if e else (f"{'-':>9}",) * 2
        lines.append(f"{w:>6.3g} {b['accuracy']:>11.4f} {p['accuracy']:>10.4f} {ens[0]} "
                     f"{b['ece']:>11.4f} {p['ece']:>10.4f} {ens[1]}")
    return "\n".join(lines)
