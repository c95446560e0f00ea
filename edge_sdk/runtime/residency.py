"""This thread's resident interpreters: a configuration's slices built into the runtime's graph
(:mod:`edge_sdk.answers.graph`) from verified bytes, warmed up by one invoke, kept per thread by
file, resized to the batch size a call needs, and the least recently used evicted beyond
``memory_cap_mb``. What building, resizing and evicting cost is first-use time: reported, and
kept out of the policy's latency estimates. A mixin of :class:`edge_sdk.runtime.model.EdgeModel`
(which sets the attributes declared below)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from edge_sdk.answers.graph import ANSWER, RawInput, runtime_graph
from edge_sdk.answers.ood_graph import OOD

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.bundle.records import FileEntry
    from edge_sdk.bundle.manifest import Manifest
    from edge_sdk.store.sources import SliceSource
    from edge_sdk.inputs.checks import InputChecker
    from edge_sdk.policy.policy import Policy
    from edge_sdk.answers.uncertainty import Uncertainty

# One interpreter of a slice: (the backend's interpreter, its input, logits and answer tensor
# indices; the answer: edge_sdk.answers.graph, -1 when the slice has none). The interpreters
# come from the backend by name (no stubs), hence Any.
Interp = tuple[Any, int, int, int]

# this thread's resident interpreters: file name -> [its interpreter, the batch it is sized to]
Cache = OrderedDict[str, list[Any]]


class PerThread(threading.local):
    """One thread's interpreters. ``cache``: by file name, least recently used first.
    ``ready``: by configuration id, the one interpreter of a point or head configuration that
    is resident at batch 1 with its first use recorded, so a one-sample call finds it with one
    lookup (``_resident``'s checks cost 0.5 us warm, more after a wide invoke); only
    without ``memory_cap_mb`` (whose LRU order every use moves), emptied whenever ``cache``
    changes (a build, a resize, an eviction)."""

    def __init__(self) -> None:
        self.cache: Cache = OrderedDict()
        self.ready: dict[str, list[Interp]] = {}


class Residency:
    # What EdgeModel sets (declared for the checker; no class attributes at run time).
    manifest: Manifest
    policy: Policy
    bundle_dir: Path
    threads: int | None  # None: the interpreter's default
    memory_cap_mb: float | None
    _slices: SliceSource
    _answerable: dict[str, Configuration]
    _raw: RawInput
    _interp_cls: Any
    _inputs: InputChecker
    _clock: Callable[[], float]
    _local: PerThread
    _lock: threading.Lock
    _share_mb: dict[str, float]
    _unc: Uncertainty | None
    _unc_width: dict[str, str]
    # config id -> (its interpreter's score output, -1: numpy; its width's threshold)
    _ood_at: dict[str, tuple[int, float]]

    def _build(self, c: Configuration, files: Sequence[FileEntry] | None = None,
               plain: bool = False) -> list[Interp]:
        """The interpreters of ``c``'s files (``files``: only those), created and allocated:
        ``[(interpreter, input index, logits index, answer index or -1)]`` per file. A store
        bundle's slice is materialised and verified here if it is not resident (part of the
        first-use cost). Each runs the runtime's graph of its slice
        (:mod:`edge_sdk.answers.graph`): fed raw samples, and a point or head slice with the
        answer's softmax appended; ``plain``: the slice's own graph, fed normalised samples
        (benchmarks)."""
        interps: list[Interp] = []
        wk = self._unc_width.get(c.id) if self._unc is not None else None
        # the score's ops (version-2 statistics): a point or head slice's one file
        ood = None if wk is None or plain or self._unc is None or len(c.files) != 1 else \
            self._unc.graph_spec(wk, c.samples if c.scope == "head" else 1)
        for f in c.files if files is None else files:
            # verified bytes only: read and checked at load(), or materialised and checked
            data = self._slices[f.name]
            if not plain:  # part of the first-use cost (~6 ms: read back, written again)
                # not kept beyond its interpreter: a store bundle's slices obey memory_cap_mb
                a = self._answerable.get(f.name)
                data = runtime_graph(data, self._raw, None if a is None else (
                    a.temperature, a.samples if a.scope == "head" else 1),
                    f"{self.bundle_dir}: {f.name}", ood)
            it = self._interp_cls(model_content=data, num_threads=self.threads,
                                  model_name=f.name)
            it.allocate_tensors()
            # tensor indices looked up once: get_*_details() costs more than a small invoke
            outs = it.get_output_details()
            ans = next((int(o["index"]) for o in outs if o["name"] == ANSWER), -1)
            if not plain and wk is not None and self._unc is not None:
                self._ood_at[c.id] = (next((int(o["index"]) for o in outs if o["name"] == OOD),
                                           -1), self._unc.widths[wk].threshold)
            interps.append((it, it.get_input_details()[0]["index"], outs[0]["index"], ans))
        return interps

    def _forget_interpreters(self) -> None:
        """Drop this thread's interpreters: the next call rebuilds them (tests)."""
        self._local.cache.clear()
        self._local.ready.clear()

    def _interpreters(self, c: Configuration) -> list[Interp]:
        """``c``'s interpreters for this thread at batch 1 (benchmarks)."""
        return self._resident(c, 1)[0]

    def _file_shares(self) -> dict[str, float]:
        """MB charged per resident file: its configuration's memory need split over its files
        by size (the first configuration listing it sets it; all-scope configurations of
        several S list the same sample files and have the same share per file)."""
        shares: dict[str, float] = {}
        for c in self.manifest.configurations:
            total = sum(f.bytes for f in c.files)
            for f in c.files:
                shares.setdefault(f.name, self.policy.memory_need_mb(c) * f.bytes / total)
        return shares

    def _resident(self, c: Configuration, n: int = 1) -> tuple[list[Interp], float]:
        """(interpreters of ``c`` for this thread at batch ``n``, ms spent materialising,
        building or resizing them in this call: kept out of the latency estimate). Cached per
        thread by *file*, so configurations sharing files (the all scope at S = 1 .. S_max
        lists the same sample files) share interpreters. A new interpreter is warmed up by one
        invoke, so no call's measurement includes its first-use cost."""
        local = self._local
        cache = local.cache
        spent = 0.0
        files = c.files
        entries: tuple[list[Any], ...]
        if len(files) == 1:  # point and head: the common case, kept lean
            name = files[0].name
            entry = cache.get(name)
            if entry is not None:
                if self.memory_cap_mb is not None:  # the LRU order matters only for eviction
                    cache.move_to_end(name)
                if entry[1] == n and c.id in self.policy.first_use_ms:
                    ready = [entry[0]]  # resident at this batch size: nothing to do
                    if n == 1 and self.memory_cap_mb is None:
                        local.ready[c.id] = ready
                    return ready, 0.0
                entries = (entry,)
            else:
                entries, spent = self._add(cache, c, files)
        else:
            missing = [f for f in files if f.name not in cache]
            if missing:
                _, spent = self._add(cache, c, missing)
            for f in files:
                cache.move_to_end(f.name)
            entries = tuple(cache[f.name] for f in files)
        if not spent and c.id not in self.policy.first_use_ms:
            with self._lock:  # first used on files another configuration built: free
                self.policy.first_use_ms.setdefault(c.id, 0.0)
        if any(e[1] != n for e in entries):
            local.ready.clear()
            t0 = self._clock()
            for e in entries:
                if e[1] != n:
                    it, inp = e[0][0], e[0][1]
                    it.resize_tensor_input(inp, [n, *self._inputs.want])
                    it.allocate_tensors()
                    e[1] = n
            spent += (self._clock() - t0) * 1000
        return [e[0] for e in entries], spent

    def _add(self, cache: Cache, c: Configuration, files: Sequence[FileEntry]
             ) -> tuple[tuple[list[Any], ...], float]:
        """Build and warm up ``files`` of ``c`` into this thread's ``cache``, record ``c``'s
        first-use cost, then evict least recently used files (never ``c``'s) beyond
        ``memory_cap_mb``."""
        t0 = self._clock()
        entries: list[list[Any]] = []  # [interpreter, its batch size]
        for f, interp in zip(files, self._build(c, files)):
            it, inp = interp[0], interp[1]
            it.set_tensor(inp, np.zeros((1, *self._inputs.want), self._inputs.feed_dtype))
            it.invoke()
            entries.append([interp, 1])
        spent = (self._clock() - t0) * 1000
        with self._lock:
            self.policy.first_use_ms[c.id] = spent
        self._local.ready.clear()  # a file replaced or evicted: no stale interpreter served
        for f, e in zip(files, entries):
            cache[f.name] = e
        if self.memory_cap_mb is not None:
            keep = {f.name for f in c.files}
            total = sum(self._share_mb[k] for k in cache)
            for k in [k for k in cache if k not in keep]:  # least recently used first
                if total <= self.memory_cap_mb:
                    break
                del cache[k]
                total -= self._share_mb[k]
        return tuple(entries), spent
