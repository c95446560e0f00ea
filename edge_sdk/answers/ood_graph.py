"""The out-of-distribution score inside the interpreter: ops the runtime appends to a slice's
graph after its features, so a call reads one scalar instead of scoring in numpy.

**Why appended by the runtime, not exported in the slice.** The bank belongs to a *width*: every
configuration of it (the float slice, its dynamic-range and integer variants, the head scope
that runs the same backbone) reads the same features, so ``uncertainty.bin`` stores it once per
width. Exported into each slice it would be stored once per precision and scope (3-4× the bytes
on the shipped recipes), and a bundle's slices would change with every re-screen of the score.
The runtime already rebuilds each slice's graph once when it first builds its interpreter
(:mod:`edge_sdk.answers.graph`: raw input, tempered softmax); the score's ops join that one
rebuild, costing nothing per call beyond their own kernels.

The ops, on the slice's two outputs (logits ``z [N·S, C]``, penultimate features ``f [N, D]``),
with the bank ``B [M, D]`` of unit rows (decoded from ``uncertainty.bin``'s int8 codes, float32
in the graph: the ``FULLY_CONNECTED`` of a float input by int8 weights would quantize ``u`` per
call, an error the score need not carry for ~20k multiply-adds)::

    u     = L2_NORMALIZATION(f)                 # f / max(||f||, 1e-6)
    knn   = REDUCE_MIN(FULLY_CONNECTED(u, -B))  # score "knn" (k = 1): -(the nearest row's cosine)
    # score "energy+knn" (a z-normalised sum, Liu et al. 2020's energy at T = 1):
    e     = LOG(REDUCE_MAX(SOFTMAX(z))) - REDUCE_MAX(z)   # = -logsumexp(z)
    score = a * e + b * knn + c                 # a = 1/sd_e, b = 1/sd_knn, c = -(m_e a + m_knn b)

The bank is stored negated in the graph so that one ``REDUCE_MIN`` gives the score itself (no
op for the sign: each op costs ~0.1-0.2 us a call). ``-logsumexp(z)`` as
``log max softmax(z) - max z``: TFLite has no LOGSUMEXP, and the softmax's
largest probability is at least 1 / C, so its log never underflows. A head's logits are
averaged over its ``S`` rows first (its features are the backbone's, one row per sample).
:meth:`edge_sdk.answers.uncertainty.Uncertainty.score` is the numpy reference of the same maths.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from edge_sdk.tflite.tensors import Op, Tensor

if TYPE_CHECKING:
    from edge_sdk.tflite.graph import Graph

__all__ = ["OOD", "OodGraph", "append_ood"]

#: the name of the appended score output ``[N]`` (tensor and signature name)
OOD = "edge_sdk_ood"


@dataclass(frozen=True, eq=False)
class OodGraph:
    """What the appended ops need: ``bank`` float32 ``[M, D]`` unit rows, and for the fused
    score ``fuse = (a, b, c)``: ``a * energy + b * knn + c``; ``samples``: rows of logits per
    sample (a head's S, else 1)."""

    bank: npt.NDArray[np.float32]
    fuse: tuple[float, float, float] | None = None
    samples: int = 1


def append_ood(graph: Graph, weights: dict[str, npt.NDArray[Any]], spec: OodGraph) -> bool:
    """Append the :data:`OOD` output; False (graph untouched) when the slice has no features
    output of the bank's dimension, or its logits are not ``[S, C]`` rows."""
    if len(graph.outputs) < 2:
        return False
    logits, feats = graph.tensor(graph.outputs[0]), graph.tensor(graph.outputs[1])
    m, d = spec.bank.shape
    s = spec.samples
    if len(feats.shape) != 2 or feats.shape[1] != d or len(logits.shape) != 2 \
            or logits.shape[0] != s * feats.shape[0]:
        return False
    names = {t.name for t in graph.tensors} | set(weights)
    n = feats.shape[0]
    t = {k: f"{OOD}/{k}" for k in ("u", "bank", "sim", "knn", "z", "zmax", "p1",
                                   "pmax", "logp", "negz", "energy", "ae", "bk", "sum",
                                   "rows")}
    if names & ({OOD} | set(t.values())):
        return False
    weights[t["bank"]] = np.ascontiguousarray(-spec.bank, np.float32)
    knn = OOD if spec.fuse is None else t["knn"]
    graph.tensors += [Tensor(t["u"], (n, d)), Tensor(t["bank"], (m, d), weight=t["bank"]),
                      Tensor(t["sim"], (n, m)), Tensor(knn, (n,))]
    graph.ops += [Op("L2_NORMALIZATION", [feats.name], [t["u"]]),
                  Op("FULLY_CONNECTED", [t["u"], t["bank"]], [t["sim"]]),
                  Op("REDUCE_MIN", [t["sim"]], [knn], {"axes": [1]})]
    if spec.fuse is not None:
        a, b, c = spec.fuse
        classes = logits.shape[1]
        z = logits.name
        if s > 1:  # a head: the energy of its rows' mean logits
            graph.tensors += [Tensor(t["rows"], (n, s, classes)), Tensor(t["z"], (n, classes))]
            graph.ops += [Op("RESHAPE", [z], [t["rows"]], {"shape": [-1, s, classes]}),
                          Op("MEAN", [t["rows"]], [t["z"]], {"axes": [1], "keep_dims": False})]
            z = t["z"]
        graph.tensors += [Tensor(t[k], (n, classes) if k == "p1" else (n,))
                          for k in ("zmax", "p1", "pmax", "logp", "negz", "energy", "ae",
                                    "bk", "sum")] + [Tensor(OOD, (n,))]
        graph.ops += [
            Op("REDUCE_MAX", [z], [t["zmax"]], {"axes": [1]}),
            Op("SOFTMAX", [z], [t["p1"]], {"beta": 1.0}),
            Op("REDUCE_MAX", [t["p1"]], [t["pmax"]], {"axes": [1]}),
            Op("LOG", [t["pmax"]], [t["logp"]]),
            Op("MUL", [t["zmax"]], [t["negz"]], {"scalar": -1.0}),
            Op("ADD", [t["logp"], t["negz"]], [t["energy"]]),
            Op("MUL", [t["energy"]], [t["ae"]], {"scalar": float(a)}),
            Op("MUL", [t["knn"]], [t["bk"]], {"scalar": float(b)}),
            Op("ADD", [t["ae"], t["bk"]], [t["sum"]]),
            Op("ADD", [t["sum"]], [OOD], {"scalar": float(c)})]
    graph.outputs.append(OOD)
    return True


def ood_numpy(spec: OodGraph, features: npt.ArrayLike, logits: npt.ArrayLike | None = None
              ) -> npt.NDArray[np.float64]:
    """The appended ops' maths in numpy, float32 like the interpreter (the reference the
    tests hold the graph to, and the runtime's path where no graph carries the score):
    ``features [N, D]``, ``logits [N * S, C]`` (needed for the fused score)."""
    bank = spec.bank
    f = np.asarray(features, np.float32).reshape(-1, bank.shape[1])
    norms = np.sqrt(np.einsum("nd,nd->n", f, f))
    u = f / np.maximum(norms, np.float32(1e-6))[:, None]  # TFLite's L2Norm epsilon
    # 64 rows per product: a larger [N, D] x [D, M] product makes OpenBLAS start its threads,
    # which on a busy 2-core device costs milliseconds
    knn = -np.concatenate([(u[i:i + 64] @ bank.T).max(1) for i in range(0, len(u), 64)]) \
        if len(u) else np.zeros(0, np.float32)
    if spec.fuse is None:
        score: npt.NDArray[np.float64] = knn.astype(np.float64)
        return score
    if logits is None:
        raise ValueError("the fused score needs the logits")
    z = np.asarray(logits, np.float32).reshape(len(f), spec.samples, -1).mean(1)
    zmax = z.max(1)
    energy = -(zmax + np.log(np.exp(z - zmax[:, None]).sum(1)))
    a, b, c = spec.fuse
    fused: npt.NDArray[np.float64] = (a * energy.astype(np.float64)
                                      + b * knn.astype(np.float64) + c)
    return fused
