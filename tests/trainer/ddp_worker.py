"""Worker for the 2-process gloo test (a module, so torch.multiprocessing can spawn it)."""
import os

import torch


def run_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from trainer.config import load_config
    from trainer.data import load_data
    from trainer.train import build_model, train

    cfg = load_config("digits", ["train.epochs=1", "train.eval_every=100",
                                 "data.calib_samples=64", "train.eval_widths=[1.0]"])
    if rank == 0:
        torch.manual_seed(cfg.seed)
        params = {k: v.detach().clone() for k, v in
                  build_model(cfg, load_data(cfg.data)).named_parameters()}
        torch.save(params, os.path.join(out, "init.pt"))
    result = train(cfg, os.path.join(out, "out"), progress=False, log=lambda *a: None)
    params = {k: v.detach().clone() for k, v in result.model.named_parameters()}
    torch.save(params, os.path.join(out, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()
