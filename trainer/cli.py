"""``edge-sdk train``: the workstation subcommands registered under ``edge_sdk.commands``."""
from __future__ import annotations

import argparse


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
    p.add_argument("--no-progress", action="store_true", help="no per-batch progress bar")
    args = p.parse_args(argv)

    from trainer.config import load_config
    from trainer.train import train

    cfg = load_config(args.config, args.overrides)
    result = train(cfg, args.out, resume=args.resume, progress=not args.no_progress)
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"wall time {result.seconds:.1f} s")
        print(result.checkpoint)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0
