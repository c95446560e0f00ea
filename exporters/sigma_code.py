"""Posterior sigma in the store (docs/store.md §2): per layer either the version-2
``absolute`` coding (``2**bits`` log-spaced values of sigma, :func:`exporters.store.encode_sigma`)
or the ``relative`` one: a codebook of ``sigma / max(|mu_dec|, step_c / 2)`` (the weight's
sqrt(alpha), up to the reference) with 0 or 1 index bits, used where it is that cheap.

Variational-dropout-style posteriors tie sigma to ``|mu|`` (``sigma^2 = alpha mu^2``; the
trainer initialises ``sigma = |mu| exp(log_alpha_init / 2)``). Where alpha stayed (nearly) at a
per-layer value, ``log(sigma / |mu|)`` hardly spreads and one multiplier per layer (0 bits) or
two (1 bit) code sigma as well as 4 bits of sigma itself; where alpha was learned per weight,
a 2- or 3-bit relative codebook moved the ensemble's mutual information by +6 .. +97 % against
+-5 % for the 4-bit absolute one (``benchmarks/store_sigma.py``, docs/store.md §7), so those
layers keep the absolute coding. The reference is the *decoded* point weight (what the device
has) floored at half the int8 step of its output channel, so a weight whose mean rounds to 0
(or is an exact 0: PWFN, SQS) still has a positive reference
(:func:`edge_sdk.store.decode.sigma_reference`, the device's definition). An exact
``sigma = 0`` (PWFN's fixed singletons) is a codebook entry 0 in either coding. The relative
codebook is Lloyd-Max (1-D k-means, quantile-initialised) on the log values.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_sdk.errors import ConfigError
from edge_sdk.store.decode import sigma_reference

__all__ = ["REL_MAX_BITS", "REL_TOL", "SigmaCode", "code_sigma", "encode_sigma",
           "lloyd_log", "relative_code"]

# the relative coding is used with at most REL_MAX_BITS index bits and an RMS log error of at
# most REL_TOL over the layer's non-zero sigmas (the 4-bit absolute coding's is 0.08 .. 0.18 on
# the measured checkpoints; Fashion-MNIST trained: 0 bits at 0.03 .. 0.14, MI within 1.5 %)
REL_TOL = 0.15
REL_MAX_BITS = 1


@dataclass
class SigmaCode:
    """One layer's coded sigma: ``coding`` (absolute | relative), ``book`` (float32; an entry 0
    for sigma = 0), ``idx`` (per weight, flat), ``bits`` (index bits, ``ceil(log2 len(book))``)
    and ``rms`` (RMS log error over the non-zero sigmas)."""

    coding: str
    book: np.ndarray
    idx: np.ndarray
    bits: int
    rms: float

    def decode(self, ref: np.ndarray | None = None) -> np.ndarray:
        """The decoded sigma (float32, flat); ``ref``: :func:`sigma_reference` (relative)."""
        v = np.take(self.book, self.idx)
        if self.coding == "absolute":
            return v
        return v * np.asarray(ref, np.float32).reshape(-1)


def encode_sigma(sigma: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """sigma on a per-layer codebook of ``2**bits`` float32 values, log-spaced from the layer's
    smallest to its largest positive sigma (one entry is 0 when some sigma is 0: PWFN's fixed
    singletons), each weight taking the nearest entry in log space. (codebook, indices): the
    ``absolute`` coding."""
    s = _check(sigma)
    k = 1 << bits
    pos = s[s > 0]
    zero = bool((s == 0).any())
    if pos.size == 0:
        return np.zeros(1, np.float32), np.zeros(s.size, np.int64)
    lo, hi = float(pos.min()), float(pos.max())
    n = max(k - int(zero), 1)
    book = np.exp(np.linspace(np.log(lo), np.log(hi), n)) if n > 1 and hi > lo else \
        np.full(1, np.sqrt(lo * hi))
    book = book.astype(np.float32)
    if hi > lo and n > 1:
        pos_idx = np.rint((np.log(np.maximum(s, lo)) - np.log(lo)) / (np.log(hi) - np.log(lo))
                          * (n - 1)).astype(np.int64)
    else:
        pos_idx = np.zeros(s.size, np.int64)
    if zero:
        book = np.concatenate([[0.0], book]).astype(np.float32)
        idx = np.where(s == 0, 0, pos_idx + 1)
    else:
        idx = pos_idx
    return book, idx


def _check(sigma) -> np.ndarray:
    s = np.asarray(sigma, np.float64).reshape(-1)
    if not np.isfinite(s).all() or (s < 0).any():
        raise ConfigError("posterior sigma must be finite and >= 0")
    return s


def lloyd_log(x: np.ndarray, k: int, iters: int = 50, centre: str = "geo") -> np.ndarray:
    """Sorted centres of a ``k``-level Lloyd-Max quantizer of the log values ``x`` (float64;
    at most the distinct values), initialised at the quantiles, each value in the cell of its
    nearest centre. ``centre`` geo: a cell's mean log (squared log error); rms: the log of its
    RMS (the cell's variance kept: ``KL(N(0, s^2) || N(0, q^2))`` summed is least)."""
    u = np.unique(x)
    if u.size <= k:
        return u
    xs = np.sort(x)
    c = np.quantile(xs, (np.arange(k) + 0.5) / k)
    for _ in range(iters):
        cut = np.searchsorted((c[1:] + c[:-1]) / 2, xs)
        n = np.bincount(cut, minlength=k)
        if centre == "rms":
            top = xs.max()  # exp(2 (x - top)) <= 1: no overflow
            m2 = np.bincount(cut, np.exp(2 * (xs - top)), k) / np.maximum(n, 1)
            new = top + 0.5 * np.log(np.maximum(m2, 1e-300))
        else:
            new = np.bincount(cut, xs, k) / np.maximum(n, 1)
        c2 = np.sort(np.where(n > 0, new, c))
        if np.array_equal(c2, c):
            break
        c = c2
    return np.unique(c)


def _lloyd_code(s: np.ndarray, ref: np.ndarray, coding: str, bits: int,
                centre: str = "geo") -> SigmaCode:
    """``s`` / ``ref`` (flat float64) on a ``2**bits``-entry Lloyd-Max codebook in the log
    domain (one entry 0 when some s is 0), each value taking its nearest stored entry."""
    zero = s == 0
    pos = ~zero
    levels = (1 << bits) - int(zero.any())
    if levels < 1:
        raise ConfigError(f"{bits} bits leave no codebook level for the non-zero sigmas")
    x = np.log(s[pos] / ref[pos])
    book32 = np.exp(lloyd_log(x, levels, centre=centre)).astype(np.float32)
    lb = np.log(book32.astype(np.float64))  # nearest of the stored float32 values
    j = np.searchsorted((lb[1:] + lb[:-1]) / 2, x) if lb.size > 1 else np.zeros(x.size, int)
    off = int(zero.any())
    idx = np.zeros(s.size, np.int64)
    idx[pos] = j + off
    book = np.concatenate([np.zeros(off, np.float32), book32]).astype(np.float32)
    code = SigmaCode(coding, book, idx, (book.size - 1).bit_length(), 0.0)
    code.rms = _rms_log(code.decode(ref if coding == "relative" else None), s)
    return code


def _rms_log(got: np.ndarray, s: np.ndarray) -> float:
    """RMS log error of the decoded sigmas ``got`` over the non-zero ``s`` (0 when none)."""
    pos = s > 0
    if not pos.any():
        return 0.0
    return float(np.sqrt(np.mean((np.log(got[pos].astype(np.float64)) - np.log(s[pos])) ** 2)))


def relative_code(sigma: np.ndarray, mu_dec: np.ndarray, step: np.ndarray, bits: int,
                  centre: str = "geo") -> SigmaCode:
    """The relative coding at ``bits`` index bits (``mu_dec``: the decoded point weights, torch
    layout; ``step``: the int8 step per output channel)."""
    s = _check(sigma)
    ref = sigma_reference(np.asarray(mu_dec, np.float32), np.asarray(step, np.float32))
    return _lloyd_code(s, ref.reshape(-1), "relative", bits, centre)


def absolute_code(sigma: np.ndarray, bits: int, centre: str = "geo") -> SigmaCode:
    """An absolute Lloyd-Max codebook of log sigma (measured only: benchmarks/store_sigma.py)."""
    s = _check(sigma)
    return _lloyd_code(s, np.ones(s.size), "absolute", bits, centre)


def code_sigma(sigma: np.ndarray, mu_dec: np.ndarray, step: np.ndarray, *, bits: int = 4,
               rel_tol: float | None = REL_TOL, rel_max_bits: int = REL_MAX_BITS) -> SigmaCode:
    """One layer's sigma as the store holds it: the relative coding with the fewest index bits
    (0 .. ``rel_max_bits``) whose RMS log error is <= ``rel_tol``, else the absolute one at
    ``bits`` (``rel_tol`` None: always absolute, the version-2 store)."""
    s = _check(sigma)
    if s.size != np.asarray(mu_dec).size:
        raise ConfigError(f"sigma has {s.size} values, the weights {np.asarray(mu_dec).size}")
    if rel_tol is not None and (s > 0).any():
        for b in range(int((s == 0).any()), rel_max_bits + 1):
            c = relative_code(s, mu_dec, step, b)
            if c.rms <= rel_tol:
                return c
    book, idx = encode_sigma(s, bits)
    return SigmaCode("absolute", book, idx, (book.size - 1).bit_length(),
                     _rms_log(np.take(book, idx), s))
