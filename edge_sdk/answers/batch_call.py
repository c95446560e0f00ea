"""The call-level half of :class:`edge_sdk.answers.prediction.BatchPrediction`: what the
``predict_batch`` call itself answered (its configuration, its time, whether its budget was
met), who answered each sample, the batch as plain values (``to_dict``) and a slice of it as
a batch again. A mixin that knows the per-sample answers only through ``_list()`` (and so
imports nothing of the module that defines them)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

# the per-sample arrays a slice takes views of (entropy and mutual_info: computed when read)
ARRAYS = ("labels", "confidence", "probs", "abstain", "ood_score", "in_distribution",
          "prediction_sets", "input_suspect")


class BatchCall:
    latency_ms: float  # wall time of the whole predict_batch() call: what the app waited
    invoke_ms: float  # the interpreter part of it (every stage, every invoke)
    budget_met: bool  # the batch's memory fitted and latency_ms was within the budget
    stage_ids: tuple[str, ...]  # the call's plan: its configurations in stage order
    _n: int
    _single: str | None  # the one configuration that answered (of_one), else None
    _ids: np.ndarray | None  # config_ids, made when first read
    _src: tuple[Any, slice] | None  # a slice: of which batch, which samples
    _preds: list[Any] | None
    _make: Callable[[int], Any] | None
    _entropy: np.ndarray | None
    _mi: np.ndarray | None
    _bp: Any

    def _list(self) -> list[Any]:
        if self._preds is None:
            make = self._make
            assert make is not None  # (set whenever _preds is None)
            self._preds = [make(i) for i in range(self._n)]
        return self._preds

    def _call(self, latency_ms: float, invoke_ms: float, met: bool,
              stage_ids: tuple[str, ...], single: str | None) -> None:
        self.latency_ms, self.invoke_ms, self.budget_met = latency_ms, invoke_ms, met
        self.stage_ids, self._single, self._ids, self._src = stage_ids, single, None, None

    @property
    def config_ids(self) -> np.ndarray:
        """``[N]`` read-only str array: the configuration that answered each sample (a
        cascade's batch mixes its stages'), made when first read."""
        ids = self._ids
        if ids is None:
            ids = np.full(self._n, self._single) if self._single is not None else \
                np.array([p.config_id for p in self._list()], dtype=str)
            ids.setflags(write=False)
            self._ids = ids
        return ids

    @property
    def config_id(self) -> str:
        """The batch's configuration: the one that answered every sample, or, when a
        cascade's stages shared the batch, the last stage that ran (the plan's final
        configuration, which answered what the earlier stages were unsure of). An empty
        slice: its batch's."""
        if self._single is not None:
            return self._single
        if not self._n and self._src is not None:
            return str(self._src[0].config_id)
        answered = set(self.config_ids.tolist())
        for cid in reversed(self.stage_ids):  # the plan's stages, the last first
            if cid in answered:
                return cid
        # no plan given (a batch made from predictions elsewhere): the widest that answered,
        # which is the last stage of every plan the runtime makes (narrow to wide)
        widths = {p.config_id: p.width for p in self._list()}
        return max(sorted(widths), key=widths.__getitem__, default="")

    def to_dict(self) -> dict[str, Any]:
        """The batch as plain Python values (JSON-ready): the call's own fields (``size``,
        ``config_id``, ``stage_ids``, ``latency_ms``, ``invoke_ms``, ``budget_met``) and
        ``predictions``, each sample's ``Prediction.to_dict()`` in order (what ``edge-sdk
        run --json`` prints, one per line). It makes the per-sample predictions: for the
        numbers alone, read the arrays."""
        return {"size": self._n, "config_id": self.config_id,
                "stage_ids": list(self.stage_ids), "latency_ms": self.latency_ms,
                "invoke_ms": self.invoke_ms, "budget_met": self.budget_met,
                "predictions": [p.to_dict() for p in self._list()]}

    def _slice(self, s: slice) -> Any:
        """The samples ``s`` picks, as a batch of the same call: its arrays are views of
        these (read-only as they are), its per-sample predictions made on first use as the
        whole batch's would be (each keeps the call's ``batch_size``)."""
        out = object.__new__(type(self))
        idx = range(self._n)[s]
        out._n = len(idx)
        out._call(self.latency_ms, self.invoke_ms, self.budget_met, self.stage_ids,
                  self._single)
        out._src, out._bp = (self, s), None
        out._ids = None if self._ids is None else self._ids[s]
        out._entropy = None if self._entropy is None else self._entropy[s]
        out._mi = None if self._mi is None else self._mi[s]
        for name in ARRAYS:
            a = getattr(self, name)
            setattr(out, name, None if a is None else a[s])
        if self._preds is not None:
            out._preds, out._make = self._preds[s], None
        else:
            make = self._make
            assert make is not None  # (set whenever _preds is None)
            out._preds, out._make = None, lambda i: make(idx[i])
        return out
