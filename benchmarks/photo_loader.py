"""Is the streamed photo loader the bottleneck? The same training steps fed two ways.

- **streamed**: ``trainer.train``'s loader over the training folder (:class:`trainer.folders.
  FolderDataset`: Pillow decode + RandomResizedCrop + flip in ``train.num_workers`` worker
  processes), a fresh epoch iterator per round, so each round pays the pipeline's fill;
- **cached** (``--cache``): the same loader reading the decoded cache (``data.cache: memmap``,
  trainer/photo_cache.py) instead of the JPEGs;
- **in memory**: the same batches decoded once beforehand and held as normalised tensors
  (the strongest honest baseline: the steps' own cost and nothing else).

Both run the config's model and regime (the full width alone: ``nested_start``'s first half,
the step a loader must keep up with most; the nested sandwich step: the second half), in
alternated rounds, torch at ``--threads``; images/s is the median over rounds, the ratio
streamed / in memory (issue 53's goal: >= 0.9 at 128 and 224 px with the workers the config
ships)::

    python benchmarks/photo_loader.py --data /path/to/clothing-dataset-small --sizes 128,224
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from trainer.config import apply_overrides, load_config
from trainer.data import load_data
from trainer.device import channels_last_
from trainer.regime import regime_step
from trainer.train import _loader, _optimizer, build_model


def _step(model, opt, cfg, x, y, nested: bool) -> None:
    opt.zero_grad(set_to_none=True)
    regime_step(model, model, x, y, cfg, noise=False, regularizer=lambda: torch.zeros(()),
                nested=nested)
    opt.step()


def measure(size: int, args) -> list[dict]:
    cfg = apply_overrides(load_config(args.config), [f"data.source=imagefolder:{args.data}",
                                                     f"data.image_size={size}", *args.set])
    torch.set_num_threads(args.threads)
    data = load_data(cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg, data)
    channels_last_(model, cfg.train.channels_last)
    model.set_mask_scope(cfg.ordering.mask_scope)
    model.train()
    opt = _optimizer(model, cfg)
    sources = {"streamed": data.train}
    if args.cache:  # the same photos from the decoded cache (data.cache: memmap)
        sources["cached"] = load_data(apply_overrides(cfg, ["data.cache=memmap"]).data).train
    counts = ([cfg.train.num_workers] if args.workers is None
              else [int(w) for w in args.workers.split(",")])
    loaders = {f"{k} w{w}": _loader(ds, cfg.train.batch_size, True, cfg.seed, workers=w)
               for k, ds in sources.items() for w in counts}
    loader = next(iter(loaders.values()))
    held = []  # the in-memory arm: one round's batches, decoded once
    for x, y in loader:
        held.append((x, y))
        if len(held) == args.steps:
            break
    rows = []
    for nested in [p == "nested" for p in args.phases.split(",")]:
        rates: dict[str, list[float]] = {k: [] for k in (*loaders, "in memory")}
        _step(model, opt, cfg, *held[0], nested)  # warm-up: first-call allocations
        for _ in range(args.rounds):
            for arm in rates:
                t0 = time.perf_counter()
                n = 0
                batches = iter(loaders[arm]) if arm in loaders else iter(held)
                for i, (x, y) in zip(range(args.steps), batches):
                    _step(model, opt, cfg, x, y, nested)
                    n += len(y)
                rates[arm].append(n / (time.perf_counter() - t0))
        m = statistics.median(rates["in memory"])
        for arm in loaders:
            s = statistics.median(rates[arm])
            rows.append({"size": size, "step": "nested sandwich" if nested else "full width",
                         "loader": arm.split(" w")[0], "streamed": s, "in memory": m,
                         "ratio": s / m, "workers": int(arm.split(" w")[1])})
            print(f"{size} px {rows[-1]['step']} {arm}: {s:.1f} img/s, in memory {m:.1f} "
                  f"img/s, ratio {s / m:.3f}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="photo folder (train/ val/ test/ or classes)")
    p.add_argument("--config", default="photos")
    p.add_argument("--sizes", default="128,224")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=12, help="training steps per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--set", action="append", default=[], help="config override")
    p.add_argument("--workers", default=None,
                   help="DataLoader workers to compare, e.g. 0,1,2 (default: the config's)")
    p.add_argument("--phases", default="full,nested", help="full (width) and/or nested steps")
    p.add_argument("--cache", action="store_true", help="also the decoded cache (data.cache: "
                   "memmap) as a third arm")
    args = p.parse_args()
    rows = [r for s in args.sizes.split(",") for r in measure(int(s), args)]
    print("\n| px | step | loader | workers | loader img/s | in memory img/s | ratio |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} | {r['step']} | {r['loader']} | {r['workers']} | "
              f"{r['streamed']:.1f} | {r['in memory']:.1f} | {r['ratio']:.3f} |")


if __name__ == "__main__":
    main()
