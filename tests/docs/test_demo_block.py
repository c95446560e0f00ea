"""The README's demo block (pasted from ``runs/demo/summary.md``) lists the configurations the
demo exports today (issue 34 goal 2): when the demo's export options change, this fails until
the block is regenerated with ``make demo`` and pasted again.

What the demo exports is read from the demo itself: ``demos.digits_budget.run`` is run with
training and quantization stubbed out, up to the ``export_bundle`` call, whose options are
captured; the configuration names follow from them as the exporter names them
(``w<width>-point`` and its precisions' ``-dyn`` / ``-int8``, ``-head<S>``, ``-all<S>``, S from
``exporters.layouts.sample_counts``).
"""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


class _Stop(Exception):
    pass


def _demo_export_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("torch", exc_type=ImportError)
    import demos.digits_budget as demo
    import exporters.export as export
    import trainer.quantize.run as quantize
    import trainer.train as training

    captured = {}
    ckpt = tmp_path / "checkpoint.pt"
    monkeypatch.setattr(training, "train",
                        lambda cfg, out, **kw: SimpleNamespace(checkpoint=ckpt))
    monkeypatch.setattr(quantize, "quantize_checkpoint", lambda ckpt, cfg, out, **kw: ckpt)

    def export_bundle(checkpoint, out, opts=None, **kw):
        captured["opts"] = opts
        raise _Stop

    monkeypatch.setattr(export, "export_bundle", export_bundle)
    with pytest.raises(_Stop):
        demo.run(tmp_path / "demo", progress=False)
    return captured["opts"]


def _expected_ids(opts) -> list[str]:
    from exporters.layouts import sample_counts

    from exporters.precision import config_suffix

    counts = sample_counts(opts.samples, opts.sample_counts)
    ids = []
    for w in opts.widths:
        wk = f"{w:.2f}"
        for scope in opts.scopes:
            if scope == "point":  # in every precision (exporters.precision)
                ids += [f"w{wk}-point{config_suffix(p)}" for p in
                        getattr(opts, "precisions", ("float",))]
            else:
                ids += [f"w{wk}-{scope}{s}" for s in counts]
    return ids


def _readme_block() -> str:
    from demos.summary import SUMMARY_BEGIN, SUMMARY_END

    text = (ROOT / "README.md").read_text()
    return text[text.index(SUMMARY_BEGIN):text.index(SUMMARY_END)]


def test_the_readme_demo_block_lists_what_the_demo_exports(tmp_path, monkeypatch):
    from demos.summary import CONFIG_HEADER

    block = _readme_block()
    table = block[block.index(CONFIG_HEADER) + len(CONFIG_HEADER):].split("\n\n")[0]
    listed = [row.split("|")[1].strip() for row in table.splitlines() if row.startswith("| w")]
    want = _expected_ids(_demo_export_options(tmp_path, monkeypatch))
    assert sorted(listed) == sorted(want), (
        "the README's demo block is stale: regenerate it (make demo) and paste "
        f"runs/demo/summary.md; listed {len(listed)}, the demo exports {len(want)}: "
        f"missing {sorted(set(want) - set(listed))}, extra {sorted(set(listed) - set(want))}")
    stated = re.search(r"export of (\d+) configurations", block)
    assert stated and int(stated.group(1)) == len(want), stated


def test_the_expected_names_follow_the_exporter():
    pytest.importorskip("torch", exc_type=ImportError)
    opts = SimpleNamespace(widths=(0.5, 1.0), samples=4, sample_counts=None,
                           scopes=("point", "head", "all"))
    assert _expected_ids(opts) == [
        "w0.50-point", "w0.50-head1", "w0.50-head2", "w0.50-head4", "w0.50-all1", "w0.50-all2",
        "w0.50-all4", "w1.00-point", "w1.00-head1", "w1.00-head2", "w1.00-head4", "w1.00-all1",
        "w1.00-all2", "w1.00-all4"]
