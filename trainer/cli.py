"""``edge-sdk train``: the workstation subcommands registered under ``edge_sdk.commands``."""
from __future__ import annotations

import argparse
from pathlib import Path


def train_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk train",
        description="Train the ordered Bayesian nested network (BN³). The last line printed is "
                    "the checkpoint path, so scripts can chain on it.")
    p.add_argument("--config", default="digits",
                   help="built-in config name or path to a YAML file (default: digits)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.epochs=5 (repeatable)")
    p.add_argument("--out", default=None, help="output directory (default: runs/<config name>)")
    p.add_argument("--resume", action="store_true",
                   help="continue from <out>/checkpoint.pt if it exists")
    p.add_argument("--force", action="store_true",
                   help="start afresh over an existing run in <out> (its checkpoint is replaced)")
    p.add_argument("--no-progress", action="store_true", help="no per-batch progress bar")
    args = p.parse_args(argv)

    from trainer.config import load_config
    from trainer.train import train

    cfg = load_config(args.config, args.overrides)
    _refuse_existing_run(Path(args.out or Path("runs") / cfg.name), args)
    result = train(cfg, args.out, resume=args.resume, progress=not args.no_progress)
    import torch.distributed as dist
    final = result.checkpoint
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"wall time {result.seconds:.1f} s")
        if cfg.quantize.method != "none":
            from trainer.data import load_data
            from trainer.quantize.run import quantize_model

            final = quantize_model(result.model, cfg, load_data(cfg.data),
                                   quantized_dir(result.checkpoint, cfg.quantize.method),
                                   progress=not args.no_progress)
        print(final)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _refuse_existing_run(out: Path, args: argparse.Namespace) -> None:
    """Like ``export`` without ``--force``: a finished or interrupted run is never silently
    overwritten by a fresh one."""
    from trainer.train import CHECKPOINT_NAME

    if (out / CHECKPOINT_NAME).exists() and not (args.force or args.resume):
        from edge_sdk.errors import ConfigError

        raise ConfigError(f"{out} already holds a run ({CHECKPOINT_NAME}); pass --resume to "
                          "continue it, --force to replace it, or --out for a new directory")


def quantized_dir(checkpoint: str | Path, method: str) -> Path:
    """Next to the input checkpoint: ``<dir>/<run>-<method>/`` for ``<dir>/<run>/checkpoint.pt``,
    ``<dir>/<name>-<method>/`` for any other ``<dir>/<name>.pt``."""
    p = Path(checkpoint)
    if p.stem == "checkpoint" and p.parent.name:
        return p.parent.parent / f"{p.parent.name}-{method}"
    return p.parent / f"{p.stem}-{method}"


def quantize_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk quantize",
        description="Quantize a trained checkpoint: PWFN (one powers-of-two codebook for the "
                    "whole network, every weight keeps an uncertainty) or SQS (exact sparsity, "
                    "low-bit per-tensor codebooks, a categorical posterior). The last line "
                    "printed is the new checkpoint's path.")
    p.add_argument("checkpoint", help="a checkpoint written by `edge-sdk train`")
    p.add_argument("--method", default="pwfn", choices=["pwfn", "sqs"])
    p.add_argument("--config", default=None,
                   help="config name or YAML whose `quantize` section to use (default: the "
                        "checkpoint's own config, whose defaults run as they are)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override, e.g. --set quantize.pwfn.rule=strict or "
                        "--set quantize.sqs.bits=2 (repeatable)")
    p.add_argument("--out", default=None,
                   help="output directory (default: next to the checkpoint, <run>-<method>/ "
                        "beside the run directory of <run>/checkpoint.pt)")
    p.add_argument("--no-progress", action="store_true", help="log rounds instead of a bar")
    args = p.parse_args(argv)

    from trainer.checkpoint import load_checkpoint
    from trainer.config import apply_overrides, config_from_dict, load_config
    from trainer.quantize.run import quantize_checkpoint

    overrides = [f"quantize.method={args.method}", *args.overrides]
    if args.config is not None:
        cfg = load_config(args.config, overrides)
    else:
        cfg = apply_overrides(config_from_dict(load_checkpoint(args.checkpoint)["config"]),
                              overrides)
    out = args.out if args.out is not None else quantized_dir(args.checkpoint, args.method)
    path = quantize_checkpoint(args.checkpoint, cfg, out, progress=not args.no_progress)
    print(path)
    return 0
