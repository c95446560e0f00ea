"""A bundle's out-of-distribution statistics and conformal quantiles, numpy only.

The exporter fits them (``exporters.uncertainty``) and writes one file, ``uncertainty.bin``,
in the weight store's container format (:mod:`edge_sdk.store.container`: a canonical JSON
index plus named arrays, deterministic bytes); the manifest lists it with its sha256
(``Manifest.uncertainty``) and the runtime verifies it before decoding, like weights. The
same file in both layouts, so ``edge-sdk materialize`` copies it as it is.

What it holds, per width (every point and head configuration of a width reads the same
features: the head scope shares the point backbone):

- the bank (``<width>/bank``, int8 codes of L2-normalised training features, each row on its
  own grid, renormalised when loaded: :func:`decode_bank`) and the score (``score``):
  index version 2 (schema 9 exports): ``knn`` with ``k = 1``, minus the cosine similarity of the
  slice's penultimate features (its second output) to the nearest bank row, the rows
  class-balanced spherical-k-means prototypes of the training split (``bank``: how many per
  class, how many bits), or ``energy+knn``, that plus the energy, z-normalised with validation
  statistics (``fuse``). Computed inside the interpreter (:mod:`edge_sdk.answers.ood_graph`);
  chosen by the screen in docs/uncertainty.md. Index version 1 (earlier exports): ``knn``
  with ``k`` = 10 over 1,000 random training rows, scored in numpy (:meth:`Uncertainty.score_one`).
  Higher = less like the training data;
- ``threshold``: the score at which 95 % (``accept``) of in-distribution *validation* images
  are accepted; ``in_distribution = score <= threshold``.

And per configuration (and per two-stage cascade plan, whose answer mixes two
configurations), split-conformal quantiles ``qhat`` of the validation scores for each method
(``lac``, ``aps``, ``raps``; :mod:`edge_sdk.answers.conformal`) and each ``alpha`` of a fixed grid
(``alphas``; ``null`` / ``inf`` = the quantile is beyond the calibration set: every class);
version 2 stores them as one float16 array ``quantiles [keys, methods, alphas]`` (rounded up
to float16, at most 0.1 % above: a set can only grow), named by ``quantile_keys``, a sixth of
the JSON's bytes.
A requested alpha between grid points uses the largest grid alpha below it, so coverage stays
>= 1 - alpha (conservative, never optimistic); an alpha outside the grid's range is refused
(:func:`check_alpha`). Every set holds the answer's label (the non-empty rule,
:mod:`edge_sdk.answers.conformal`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_sdk.answers.conformal import METHODS, add_top, class_scores
from edge_sdk.answers.ood_graph import OodGraph, ood_numpy
from edge_sdk.errors import BundleError, ConfigError
from edge_sdk.store.container import decode_store
from edge_sdk.validation import real_value

__all__ = ["ALPHAS", "FILE_NAME", "INDEX_VERSION", "Uncertainty", "cascade_key",
           "check_alpha", "decode_bank"]

FILE_NAME = "uncertainty.bin"
INDEX_VERSION = 2  # what the exporter writes; version 1 is read too
SCORES = ("knn", "energy+knn")
# the conformal grid (docs/uncertainty.md): what an app may ask for without recalibrating
# (the usual 0.05, 0.1 and 0.2; finer steps near them, coarser beyond)
ALPHAS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
BANK_SCALE = 127.0  # int8 codes of unit-vector components


def decode_bank(codes: npt.NDArray[np.int8]) -> npt.NDArray[np.float32]:
    """float32 unit rows from the int8 codes ``round(127 u)``: renormalised, because rounding
    moves a row's norm by up to ~0.5 % and the score is a cosine (scikit-learn's cosine
    distance, tests/exporters/test_uncertainty_fit.py, normalises the bank the same way)."""
    rows = codes.astype(np.float32)
    norms = np.sqrt(np.einsum("md,md->m", rows, rows))
    return np.ascontiguousarray(rows / np.maximum(norms, 1e-12)[:, None])


def cascade_key(first: str, second: str, target: str | None = None) -> str:
    """The key of a two-stage plan's quantiles: ``first>second``, and ``first>second@0.9``
    for its plan for one target accuracy (schema version 8), whose threshold mixes the two
    answers differently."""
    return f"{first}>{second}" if target is None else f"{first}>{second}@{target}"


def check_alpha(alpha: object, what: str = "alpha") -> float:
    """``alpha`` as a float in the grid's range [ALPHAS[0], ALPHAS[-1]]: a Python or numpy real
    (``np.float32(0.1)`` is 0.1: :func:`edge_sdk.validation.real_value`), not a bool;
    ConfigError naming the grid otherwise.

    Outside the grid it is refused, neither capped nor extrapolated. Capping (what qhat did
    in earlier versions: 0.7 answered at 0.5) silently hands back sets sized for another coverage
    than the one asked for. Extrapolating has nothing to stand on: beyond 0.5 no quantile was
    calibrated, and below 0.01 a validation split of a few hundred samples cannot reach one at
    all (ceil((n + 1)(1 - alpha)) > n: every class). Interpolating between grid points would
    not be the conformal quantile of any alpha either, so there the grid alpha below is used
    (:meth:`Uncertainty.qhat`): coverage stays >= 1 - alpha, which an app can rely on."""
    a = real_value(alpha)
    if a is None or not math.isfinite(a) or not ALPHAS[0] <= a <= ALPHAS[-1]:
        raise ConfigError(f"{what} must be a miscoverage rate in [{ALPHAS[0]}, {ALPHAS[-1]}], "
                          f"the range of the bundle's calibrated grid ({', '.join(map(str, ALPHAS))}; "
                          f"the prediction sets' coverage is 1 - {what}; one between grid points "
                          f"uses the grid value below it), got {alpha!r}")
    return a


def _fail(where: str, why: str) -> BundleError:
    return BundleError(f"{where}: {why} (re-export the bundle)")


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _fail(where, f"expected a finite number, got {v!r}")
    return float(v)


@dataclass
class WidthStats:
    bank: npt.NDArray[np.float32]  # [rows, D], L2-normalised rows (decoded from int8)
    threshold: float
    dim: int
    # the fused score's a * energy + b * knn + c (version 2, score energy+knn)
    fuse: tuple[float, float, float] | None = None


def fuse_weights(energy: tuple[float, float], knn: tuple[float, float]
                 ) -> tuple[float, float, float]:
    """(a, b, c) of ``z(energy) + z(knn) = a * energy + b * knn + c`` from each score's
    validation (mean, standard deviation)."""
    (me, se), (mk, sk) = energy, knn
    return 1.0 / se, 1.0 / sk, -(me / se + mk / sk)


def _quantiles_v1(idx: Mapping[str, Any], where: str
                  ) -> dict[str, dict[str, tuple[float, ...]]]:
    """Version 1: JSON lists per configuration and cascade plan (``null`` = every class)."""
    quantiles: dict[str, dict[str, tuple[float, ...]]] = {}
    for group in ("configs", "cascades"):
        table = idx.get(group, {})
        if not isinstance(table, Mapping):
            raise _fail(where, f"{group} must be a mapping")
        for key, methods in table.items():
            p = f"{where}: {group}.{key}"
            if not isinstance(methods, Mapping) or set(methods) != set(METHODS):
                raise _fail(p, f"expected quantiles for {', '.join(METHODS)}")
            row = {}
            for m, qs in methods.items():
                if not isinstance(qs, list) or len(qs) != len(ALPHAS):
                    raise _fail(f"{p}.{m}", f"expected {len(ALPHAS)} quantiles (one per "
                                            f"alpha), got {qs!r:.60}")
                row[m] = tuple(math.inf if q is None else _number(q, f"{p}.{m}") for q in qs)
            quantiles[str(key)] = row
    return quantiles


def _quantiles_v2(idx: Mapping[str, Any], store: Any, where: str
                  ) -> dict[str, dict[str, tuple[float, ...]]]:
    """Version 2: ``quantiles`` float16 ``[keys, methods, alphas]`` named by
    ``quantile_keys`` (``inf`` = every class; never NaN)."""
    keys = idx.get("quantile_keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) \
            or len(set(keys)) != len(keys):
        raise _fail(where, "quantile_keys must be a list of distinct strings")
    q = store.array("quantiles")
    if q.dtype != np.float16 or q.shape != (len(keys), len(METHODS), len(ALPHAS)) \
            or np.isnan(q).any() or (q == -np.inf).any():
        raise _fail(where, f"quantiles must be float16 [{len(keys)}, {len(METHODS)}, "
                           f"{len(ALPHAS)}] without NaN, got {q.dtype} {list(q.shape)}")
    rows = q.astype(np.float64).tolist()
    return {k: {m: tuple(rows[i][j]) for j, m in enumerate(METHODS)} for i, k in enumerate(keys)}


def quantile_array(table: Mapping[str, Mapping[str, Any]]
                   ) -> tuple[list[str], npt.NDArray[np.float16]]:
    """Version 2's (``quantile_keys``, ``quantiles``) of ``key -> method -> [qhat per alpha]``
    (None = every class): float16 rounded *up* (at most one step, 2^-10 relative), so a set is never
    smaller than at the float64 quantile (coverage stays >= 1 - alpha); the scores are
    probabilities and sums of them (at most 1 + RAPS's penalty), far inside float16's range."""
    keys = list(table)
    q = np.array([[[math.inf if v is None else float(v) for v in table[k][m]] for m in METHODS]
                  for k in keys], np.float64).reshape(len(keys), len(METHODS), len(ALPHAS))
    q16 = q.astype(np.float16)
    low = q16.astype(np.float64) < q
    q16[low] = np.nextafter(q16[low], np.float16(np.inf))
    return keys, q16


class Uncertainty:
    """The decoded ``uncertainty.bin`` of a bundle (see the module docstring)."""

    def __init__(self, index: Mapping[str, Any], widths: dict[str, WidthStats],
                 quantiles: dict[str, dict[str, tuple[float, ...]]]):
        self.index = index
        self.version = int(index.get("version", INDEX_VERSION))
        self.k: int = int(index["k"])
        self.accept = float(index["accept"])
        self.widths = widths
        self.quantiles = quantiles  # config id or cascade key -> method -> qhat per alpha
        self.raps = (float(index["raps"]["lam"]), int(index["raps"]["k_reg"]))

    # ---- reading -------------------------------------------------------------------------
    @classmethod
    def from_bytes(cls, data: bytes, where: str = FILE_NAME) -> Uncertainty:
        """Decode and check (sizes, types, values) verified bytes; BundleError naming the
        problem otherwise."""
        store = decode_store(data)
        idx = store.index
        version = idx.get("version") if isinstance(idx, Mapping) else idx
        if not isinstance(idx, Mapping) or version not in (1, INDEX_VERSION):
            raise _fail(where, f"index version {version!r}; this edge_sdk reads 1 and "
                               f"{INDEX_VERSION}")
        score = idx.get("score")
        if score not in (("knn",) if version == 1 else SCORES):
            raise _fail(where, f"score {score!r}; this edge_sdk computes "
                               f"{'knn' if version == 1 else ' or '.join(SCORES)}")
        k = idx.get("k")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or (version > 1 and k != 1):
            raise _fail(where, f"k must be an integer >= 1 (1 from version 2), got {k!r}")
        accept = _number(idx.get("accept"), f"{where}: accept")
        if not 0 < accept < 1:
            raise _fail(where, f"accept must be in (0, 1), got {accept}")
        if list(idx.get("alphas", ())) != list(ALPHAS):
            raise _fail(where, f"alphas {idx.get('alphas')!r}; this edge_sdk's grid is "
                               f"{list(ALPHAS)}")
        raps = idx.get("raps")
        if not isinstance(raps, Mapping) or not {"lam", "k_reg"} <= set(raps):
            raise _fail(where, "raps must hold lam and k_reg")
        widths: dict[str, WidthStats] = {}
        wmap = idx.get("widths")
        if not isinstance(wmap, Mapping) or not wmap:
            raise _fail(where, "expected statistics for at least one width")
        for wk, w in wmap.items():
            p = f"{where}: widths.{wk}"
            if not isinstance(w, Mapping):
                raise _fail(p, "expected a mapping")
            bank = store.array(f"{wk}/bank")
            if bank.dtype != np.int8 or bank.ndim != 2 or bank.shape[0] < k or \
                    bank.shape[1] != w.get("dim"):
                raise _fail(p, f"bank must be int8 [rows >= k = {k}, dim = {w.get('dim')!r}], "
                               f"got {bank.dtype} {list(bank.shape)}")
            fuse = None
            if score == "energy+knn":
                z = w.get("fuse")
                if not isinstance(z, Mapping) or not all(
                        isinstance(z.get(n), list) and len(z[n]) == 2 for n in ("energy", "knn")):
                    raise _fail(p, "the fused score needs fuse: {energy: [mean, std], "
                                   "knn: [mean, std]}")
                e, kk = ([_number(v, f"{p}.fuse") for v in z[n]] for n in ("energy", "knn"))
                if e[1] <= 0 or kk[1] <= 0:
                    raise _fail(p, "fuse standard deviations must be > 0")
                fuse = fuse_weights((e[0], e[1]), (kk[0], kk[1]))
            widths[str(wk)] = WidthStats(decode_bank(bank),
                                         _number(w.get("threshold"), f"{p}.threshold"),
                                         int(bank.shape[1]), fuse)
        quantiles = _quantiles_v1(idx, where) if version == 1 else _quantiles_v2(idx, store,
                                                                                  where)
        return cls(idx, widths, quantiles)

    # ---- the out-of-distribution score ---------------------------------------------------
    def graph_spec(self, width_key: str, samples: int = 1) -> OodGraph | None:
        """The ops the runtime appends to a slice of ``width_key`` to compute the score in its
        interpreter (:mod:`edge_sdk.answers.ood_graph`); None for a version-1 file (its
        k-th of 1,000 rows is scored in numpy)."""
        st = self.widths[width_key]
        if self.version == 1:
            return None
        return OodGraph(st.bank, st.fuse, samples)

    def score(self, width_key: str, features: npt.ArrayLike,
              logits: npt.ArrayLike | None = None, samples: int = 1) -> npt.NDArray[np.float64]:
        """[N] scores of features [N, D] (higher = less like the training data); ``logits
        [N * samples, C]`` for the fused score. The numpy path: the runtime reads the
        interpreter's own score where the graph computes it."""
        st = self.widths[width_key]
        if self.version > 1:
            return ood_numpy(OodGraph(st.bank, st.fuse, samples), features, logits)
        f = np.asarray(features, np.float32).reshape(-1, st.dim)
        norms = np.sqrt(np.einsum("nd,nd->n", f, f))
        kth = np.empty(len(f), np.float32)
        pos = st.bank.shape[0] - self.k
        # 4 rows per product: a larger [N, D] x [D, rows] product makes OpenBLAS start its
        # threads, which on a busy 2-core device costs milliseconds (measured: 64 rows 4.1 ms,
        # 4 rows at a time 0.1 ms, D = 32; predict_batch at N = 64 was slower than a loop)
        for i in range(0, len(f), 4):
            sims = f[i:i + 4] @ st.bank.T  # [<=4, rows], a fresh array: partitioned in place
            sims.partition(pos, axis=1)
            kth[i:i + 4] = sims[:, pos]
        scores: npt.NDArray[np.float64] = -(kth / np.maximum(norms, 1e-12)).astype(np.float64)
        return scores

    def score_one(self, width_key: str, features: npt.NDArray[np.float32],
                  logits: npt.NDArray[np.float32] | None = None, samples: int = 1) -> float:
        """:meth:`score` of one sample's features (a version-1 file's hot path: one
        matrix-vector product and one partition)."""
        st = self.widths[width_key]
        if self.version > 1:
            return float(self.score(width_key, features, logits, samples)[0])
        f = features.reshape(-1)
        sims = st.bank @ f  # a fresh array: partitioned in place (no copy, ~10 % faster)
        pos = sims.shape[0] - self.k
        sims.partition(pos)
        return -float(sims[pos]) / max(math.sqrt(float(f @ f)), 1e-12)

    # ---- conformal sets ------------------------------------------------------------------
    def qhat(self, key: str, method: str, alpha: object) -> float | None:
        """The calibrated quantile of ``key`` (a configuration id or :func:`cascade_key`) for
        ``method`` at the largest grid alpha <= ``alpha``; None when ``key`` has none.
        ConfigError for an alpha outside the grid (:func:`check_alpha`: never capped). The
        runtime caches the answer per (key, alpha), so the check is not per call."""
        a = check_alpha(alpha)
        row = self.quantiles.get(key)
        if row is None:
            return None
        i = max(j for j, g in enumerate(ALPHAS) if g <= a + 1e-12)
        return row[method][i]

    def set_mask(self, probs: npt.ArrayLike, qhat: float, method: str,
                 top: npt.ArrayLike | None = None, *, nonempty: bool = True
                 ) -> npt.NDArray[np.bool_]:
        """[N, C] boolean prediction-set mask of calibrated probabilities [N, C], each row
        holding its top class (the non-empty rule: :mod:`edge_sdk.answers.conformal`).
        ``top``: the answers' labels [N] (None: the first maximum of each row, which is what
        the runtime's labels are); ``nonempty=False``: the plain set, for analysis only."""
        p = np.asarray(probs, np.float64)
        if method == "lac":
            mask: npt.NDArray[np.bool_] = p >= 1.0 - qhat
        else:
            lam, k_reg = self.raps
            mask = class_scores(p, method, lam, k_reg) <= qhat
        if nonempty:  # one vectorised store; a row that had any class already had its top
            add_top(mask, p.argmax(1) if top is None else top)
        return mask

    def set_one(self, probs: list[float], qhat: float, method: str, top: int | None = None
                ) -> tuple[int, ...]:
        """One sample's set with its top class ``top`` (the answer's label; None: the first
        maximum), class indices in ascending order (LAC in plain Python: ten classes cost
        less than a numpy round trip)."""
        if top is None:
            top = probs.index(max(probs))
        if method == "lac":
            cut = 1.0 - qhat
            s = tuple(i for i, p in enumerate(probs) if p >= cut)
        else:
            s = tuple(np.flatnonzero(self.set_mask(np.asarray([probs]), qhat, method,
                                                   nonempty=False)[0]).tolist())
        # the non-empty rule: a non-empty set already holds the top class (every score is
        # monotone in the rank), so this is `s or (top,)` but exact even if a label ever
        # differed from the first maximum
        return s if top in s else tuple(sorted((*s, top)))
