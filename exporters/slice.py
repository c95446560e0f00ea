"""Per-width slices of the ordered, quantized Bayesian network (docs/export.md).

A slice at width w: every nested layer truncated to its first groups (the next layer's inputs
follow), kept channels rescaled by their keep probability (BN³ App. 8.2, eq. 44), and batch-norm
statistics re-collected for that width on a calibration subset of the *training* split (BN³
App. 9.2) with the weights that slice will run: the posterior's point estimate for point
slices, each sample's own weights for sampled slices.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch

from edge_sdk.errors import CheckpointError
from trainer.evaluate import recollect_bn
from trainer.layers import BayesNestedLayer
from trainer.models import NestedModel

WeightSet = dict[str, torch.Tensor]  # layer name -> weight_mu to use


def posterior_kind(ckpt: dict) -> str:
    kind = (ckpt.get("posterior") or {}).get("kind", "gaussian")
    if kind not in ("gaussian", "pwfn", "sqs"):
        raise CheckpointError(f"unknown posterior kind {kind!r}; expected gaussian, pwfn or sqs")
    return kind


def _layers(model: NestedModel) -> dict[str, BayesNestedLayer]:
    return {n: m for n, m in model.named_modules() if isinstance(m, BayesNestedLayer)}


def posterior_samples(model: NestedModel, ckpt: dict, count: int, seed: int = 0,
                      sample_tau: float | None = None) -> list[WeightSet]:
    """``count`` whole networks from the checkpoint's posterior, reproducibly.

    Gaussian (trained) and PWFN: w = mu + sigma * eps (PWFN's sigma is the spread of the means
    fixed together; its means are the codebook values). SQS: categorical draws over each kept
    weight's window components at the sampling temperature (eq. 9): samples stay on the
    codebook and keep the exact sparsity.
    """
    gen = torch.Generator().manual_seed(seed)
    kind = posterior_kind(ckpt)
    layers = _layers(model)
    if kind == "sqs":
        from trainer.quantize.sqs import sample_from_posterior

        post = ckpt["posterior"]
        tau = post["sample_tau"] if sample_tau is None else sample_tau
        return [sample_from_posterior(post, tau, gen) for _ in range(count)]
    sets = []
    for _ in range(count):
        ws = {}
        for name, layer in layers.items():
            mu = layer.weight_mu.detach()
            if kind == "pwfn":
                sigma = ckpt["posterior"]["tensors"][f"{name}.weight"]["sigma"]
            else:
                sigma = layer.weight_sigma.detach()
            eps = torch.randn(mu.shape, generator=gen, device="cpu")  # host draws: reproducible
            ws[name] = mu + sigma.to(mu.device) * eps.to(mu.device)
        sets.append(ws)
    return sets


def with_weights(model: NestedModel, weights: WeightSet | None) -> NestedModel:
    """A copy of ``model`` whose layers run ``weights`` (None: the point estimate)."""
    m = copy.deepcopy(model)
    if weights:
        layers = _layers(m)
        with torch.no_grad():
            for name, w in weights.items():
                layers[name].weight_mu.copy_(w)
    return m


def make_slice(model: NestedModel, width: float, calib: Sequence,
               weights: WeightSet | None = None, device: torch.device | None = None
               ) -> NestedModel:
    """The width-``width`` network running ``weights``, BN re-collected for it (on ``device``,
    default the model's), truncated, on the CPU (where lowering to TFLite reads it)."""
    m = with_weights(model, weights)
    if device is not None:
        m.to(device)
    recollect_bn(m, calib, width, weight_mode="mean")
    return m.cpu().truncate(width).eval()


def classifier_name(model: NestedModel) -> str:
    """The output layer's module name: ``classifier`` in the built-in models; a nested user
    network (trainer.nest) records its own (``body.fc``, ``body.classifier.1``, ...)."""
    return getattr(model, "classifier_name", "classifier")


def sliced_heads(model: NestedModel, samples: Sequence[WeightSet], width: float
                 ) -> list[torch.Tensor]:
    """Each sample's classifier weights, cut to the inputs the width-``width`` slice keeps."""
    name = classifier_name(model)
    heads = []
    for ws in samples:
        m = with_weights(model, {name: ws[name]})
        heads.append(m.truncate(width).get_submodule(name).weight_mu.detach().clone())
    return heads


def stack_heads(point_slice: NestedModel, head_weights: Sequence[torch.Tensor]) -> NestedModel:
    """The head scope: the point backbone with S classifier weight matrices (already cut to the
    slice, see :func:`sliced_heads`) stacked into one ``[S*C, in]`` layer: one invoke computes
    all S heads; the exporter reshapes the output to [S, C]."""
    m = copy.deepcopy(point_slice)
    head = m.get_submodule(classifier_name(m))
    if head.ordering is not None or head.bn is not None or head.out_scale is not None:
        raise CheckpointError("the classifier must be a plain (not nested, no BN) layer to stack "
                              "posterior heads")
    with torch.no_grad():
        head.weight_mu = torch.nn.Parameter(torch.cat(list(head_weights), 0))
        head.weight_rho = torch.nn.Parameter(head.weight_rho.detach().repeat(len(head_weights), 1))
        if head.bias is not None:
            head.bias = torch.nn.Parameter(head.bias.detach().repeat(len(head_weights)))
    head.out_channels = head.weight_mu.shape[0]
    return m
