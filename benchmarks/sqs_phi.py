"""Cost of SQS's parametrization per fine-tuning step: the mean weight lambda sum_k mu_k phi_k
and its backward, as the [weights x K] tensor expression (``SQSTensor.phi``) vs the fused,
chunked route training takes (``SQSTensor.mean_and_mode``, trainer/quantize/sqs_mean.py).

    python benchmarks/sqs_phi.py [--weights 2372960] [--bits 4] [--threads 1] [--repeats 5]

The default size is nested_vgg at width_mult 0.5 (every conv/linear weight in one tensor: the
cost is linear in the count). Also prints each route's error against float64 (max |mean| error,
relative gradient norm error of theta), so the speed is not bought with a different function.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # timing

import torch  # noqa: E402

from timing import median_ms  # noqa: E402
from trainer.config import SQSConfig  # noqa: E402
from trainer.quantize.sqs_posterior import SQSTensor  # noqa: E402


def expression(t: SQSTensor, theta: torch.Tensor) -> torch.Tensor:
    return t.keep_probability() * (t.phi(theta) * t.mu[t.window]).sum(-1)


def fused(t: SQSTensor, theta: torch.Tensor) -> torch.Tensor:
    return t.mean_and_mode(theta)[0].flatten()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=int, default=2_372_960)
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    init = torch.randn(args.weights, generator=g) * 0.02  # a trained layer's scale
    t = SQSTensor(init, SQSConfig(bits=args.bits))
    theta = (init + 0.002 * torch.randn(args.weights, generator=g)).requires_grad_()

    t64 = SQSTensor(init.double(), SQSConfig(bits=args.bits)).double()
    t64.load_state_dict({k: v.double() if v.is_floating_point() else v
                         for k, v in t.state_dict().items()})
    theta64 = theta.detach().double().requires_grad_()
    ref = expression(t64, theta64)
    (ref_grad,) = torch.autograd.grad(ref.square().sum(), [theta64])

    print(f"{args.weights:,} weights x {2 ** args.bits} components, {len(t.bounds)} windows, "
          f"{args.threads} thread(s), median of {args.repeats}")
    print(f"{'route':<12}{'forward+backward ms':>21}{'ratio':>8}{'max |mean err|':>16}"
          f"{'theta grad rel err':>20}")
    rows = {}
    for name, fn in (("expression", expression), ("fused", fused)):
        def step(fn=fn):
            fn(t, theta).square().sum().backward()
        rows[name] = median_ms(step, args.repeats, warmup=1)
        mean = fn(t, theta)
        (grad,) = torch.autograd.grad(mean.square().sum(), [theta])
        err = float((mean.detach().double() - ref.detach()).abs().max())
        rel = float((grad.double() - ref_grad).norm() / ref_grad.norm())
        print(f"{name:<12}{rows[name]:>21.0f}{rows['expression'] / rows[name]:>7.2f}x"
              f"{err:>16.2e}{rel:>20.2e}")


if __name__ == "__main__":
    main()
