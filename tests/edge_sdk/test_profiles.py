"""edge_sdk.policy.profiles: the device-profile schema, the latency estimate, the cache, and how the
runtime turns a profile into the policy's priors. Must not import torch (the device-side run)."""
from __future__ import annotations

import copy
import itertools
import math
import re
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import edge_sdk
from edge_sdk.policy import measured as M
from edge_sdk.policy import profiles as P
from edge_sdk.bundle import MANIFEST_NAME, Manifest, manifest_to_yaml, read_manifest
from edge_sdk.cli.device import profile_main
from edge_sdk.errors import ProfileError
from edge_sdk.policy.estimates import FALLBACK_GMACS, FALLBACK_OVERHEAD_MS

REQUIRED_BUILTINS = ("raspberry_pi_4", "raspberry_pi_5", "jetson_orin_nano_cpu", "pixel_phone",
                     "x86_64_laptop")
PLENTY_MB = 1e6


@pytest.fixture(autouse=True, scope="module")
def no_user_cache(tmp_path_factory):
    """load(..., profile="auto") in this module never sees the user's cache (module-scoped, so
    hypothesis tests may use it too)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE_SDK_CACHE", str(tmp_path_factory.mktemp("module-cache")))
        yield


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """An empty profile cache of this test's own, for tests that write into it."""
    monkeypatch.setenv("EDGE_SDK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def valid() -> dict:
    """A minimal valid published profile (schema version 1)."""
    return {
        "schema_version": 1, "name": "toy_board", "description": "a test board",
        "cpu": {"model": "Cortex-A53", "cores": 4, "max_clock_ghz": 1.2, "arch": "arm64"},
        "ram_mb": 1024,
        "throughput": {"fp32": {"1": {"gmacs": 1.5, "overhead_ms": 0.1},
                                "4": {"gmacs": 4.0, "overhead_ms": 0.2}},
                       "int8": {"4": {"gmacs": 9.0, "overhead_ms": 0.2}}},
        "measured": False,
        "sources": ["https://example.org/datasheet"],
    }


def measured_dict() -> dict:
    d = valid()
    d.update(measured=True, sources=[], name="this_host")
    d["bundle"] = {"manifest_sha256": "ab" * 32, "latency_ms": {"1": {"c0": 0.5, "c1": 1.5}}}
    return d


def mutated(fn, base=valid):
    d = copy.deepcopy(base())
    fn(d)
    return d


def _set(path: str, value):
    keys = path.split(".")

    def apply(d):
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return apply


def _del(path: str):
    keys = path.split(".")

    def apply(d):
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]
    return apply


# --------------------------------------------------------------------------- schema


def test_a_valid_minimal_profile_loads():
    prof = P.profile_from_dict(valid())
    assert prof.name == "toy_board" and prof.cores == 4 and prof.arch == "arm64"
    assert prof.max_clock_ghz == 1.2 and prof.ram_mb == 1024 and not prof.measured
    assert set(prof.throughput) == {"fp32", "int8"}
    assert prof.throughput["fp32"][4] == P.Throughput(gmacs=4.0, overhead_ms=0.2)
    assert set(prof.throughput["fp32"]) == {1, 4}  # thread keys become integers
    assert prof.sources == ("https://example.org/datasheet",)


def test_optional_keys_may_be_left_out():
    d = valid()
    del d["description"], d["throughput"]["int8"]
    prof = P.profile_from_dict(d)
    assert prof.description == "" and set(prof.throughput) == {"fp32"}


def test_a_measured_profile_may_omit_its_clock_and_sources():
    prof = P.profile_from_dict(mutated(_set("cpu.max_clock_ghz", None), measured_dict))
    assert prof.measured and prof.max_clock_ghz is None and prof.sources == ()
    assert prof.latency_ms == {1: {"c0": 0.5, "c1": 1.5}}


def test_zero_overhead_is_allowed():
    prof = P.profile_from_dict(mutated(_set("throughput.fp32.1.overhead_ms", 0)))
    assert prof.throughput["fp32"][1].overhead_ms == 0.0


BAD = [
    # (id, mutation, base, fragments the message must contain)
    ("missing cores", _del("cpu.cores"), valid, ["cpu", "cores"]),
    ("schema_version 2", _set("schema_version", 2), valid, ["schema_version"]),
    ("unknown top-level key", _set("gpu", {"cores": 1}), valid, ["gpu"]),
    ("unknown route", _set("throughput.fp16", {"1": {"gmacs": 1, "overhead_ms": 0}}), valid,
     ["throughput.fp16", "route"]),
    ("thread key above cores", _set("throughput.fp32.8", {"gmacs": 5, "overhead_ms": 0.1}),
     valid, ["throughput.fp32", "cpu.cores"]),
    ("thread key not an integer", _set("throughput.fp32.two", {"gmacs": 5, "overhead_ms": 0}),
     valid, ["throughput.fp32", "'two'"]),
    ("thread key fractional",
     lambda d: d["throughput"]["fp32"].update({"1.5": {"gmacs": 5, "overhead_ms": 0}}),
     valid, ["throughput.fp32", "1.5"]),
    ("thread key zero", _set("throughput.fp32.0", {"gmacs": 5, "overhead_ms": 0}),
     valid, ["throughput.fp32", "0"]),
    ("gmacs zero", _set("throughput.fp32.1.gmacs", 0), valid, ["throughput.fp32.1.gmacs"]),
    ("gmacs negative", _set("throughput.int8.4.gmacs", -3.0), valid,
     ["throughput.int8.4.gmacs"]),
    ("gmacs NaN", _set("throughput.fp32.4.gmacs", math.nan), valid,
     ["throughput.fp32.4.gmacs"]),
    ("gmacs inf", _set("throughput.fp32.4.gmacs", math.inf), valid,
     ["throughput.fp32.4.gmacs"]),
    ("gmacs bool", _set("throughput.fp32.1.gmacs", True), valid, ["throughput.fp32.1.gmacs"]),
    ("gmacs string", _set("throughput.fp32.1.gmacs", "fast"), valid,
     ["throughput.fp32.1.gmacs"]),
    ("gmacs missing", _del("throughput.fp32.1.gmacs"), valid, ["throughput.fp32.1", "gmacs"]),
    ("negative overhead", _set("throughput.fp32.1.overhead_ms", -0.01), valid,
     ["throughput.fp32.1.overhead_ms"]),
    ("no fp32 route", _del("throughput.fp32"), valid, ["throughput", "fp32"]),
    ("empty route", _set("throughput.int8", {}), valid, ["throughput.int8"]),
    ("published without sources", _set("sources", []), valid, ["sources"]),
    ("published sources missing", _del("sources"), valid, ["sources"]),
    ("sources not strings", _set("sources", [1, 2]), valid, ["sources"]),
    ("measured not a bool", _set("measured", "yes"), valid, ["measured"]),
    ("bad manifest_sha256", _set("bundle.manifest_sha256", "abc"), measured_dict,
     ["bundle.manifest_sha256"]),
    ("uppercase manifest_sha256", _set("bundle.manifest_sha256", "AB" * 32), measured_dict,
     ["bundle.manifest_sha256"]),
    ("latency thread key above cores", _set("bundle.latency_ms.9", {"c0": 1.0}), measured_dict,
     ["bundle.latency_ms", "cpu.cores"]),
    ("negative measured latency", _set("bundle.latency_ms.1.c0", -1.0), measured_dict,
     ["bundle.latency_ms.1.c0"]),
    ("null clock on a published profile", _set("cpu.max_clock_ghz", None), valid,
     ["cpu.max_clock_ghz"]),
    ("null clock, measured not stated", lambda d: (d.pop("measured"),
                                                   d["cpu"].update(max_clock_ghz=None)),
     valid, ["cpu.max_clock_ghz"]),
    ("unknown arch", _set("cpu.arch", "riscv64"), valid, ["cpu.arch"]),
    ("cores zero", _set("cpu.cores", 0), valid, ["cpu.cores"]),
    ("cores fractional", _set("cpu.cores", 2.5), valid, ["cpu.cores"]),
    ("ram_mb fractional", _set("ram_mb", 1.5), valid, ["ram_mb"]),
    ("bad name", _set("name", "my board/1"), valid, ["name"]),
    ("not a mapping", lambda d: d.clear(), valid, ["schema_version"]),
]


@pytest.mark.parametrize("mutation, base, fragments", [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_invalid_profiles_raise_profile_error_naming_the_key(mutation, base, fragments):
    d = mutated(mutation, base)
    with pytest.raises(ProfileError) as info:
        P.profile_from_dict(d, where="board.yaml")
    msg = str(info.value)
    assert msg.startswith("board.yaml"), msg  # the file it came from
    for frag in fragments:
        assert frag in msg, (frag, msg)


@pytest.mark.parametrize("value", [None, [], "profile", 3])
def test_a_non_mapping_document_is_a_profile_error(value):
    with pytest.raises(ProfileError, match="mapping"):
        P.profile_from_dict(value)


# --------------------------------------------------------------------------- the estimate


def toy(fp32: dict, int8: dict | None = None, cores: int = 8) -> P.DeviceProfile:
    """A profile whose thread-count entries are told apart by their gmacs."""
    d = valid()
    d["cpu"]["cores"] = cores
    d["throughput"] = {"fp32": {str(t): {"gmacs": g, "overhead_ms": 0.01 * t}
                                for t, g in fp32.items()}}
    if int8 is not None:
        d["throughput"]["int8"] = {str(t): {"gmacs": g, "overhead_ms": 0.02 * t}
                                   for t, g in int8.items()}
    return P.profile_from_dict(d)


@given(macs=st.integers(0, 10 ** 10), invokes=st.integers(1, 16),
       threads=st.one_of(st.none(), st.integers(1, 8)),
       weights=st.sampled_from(["dequantize", "float", "hybrid"]))
def test_estimate_is_invokes_times_macs_over_rate_plus_overhead(macs, invokes, threads, weights):
    prof = toy({1: 1.5, 2: 2.75, 4: 5.0}, {2: 7.0})
    f = prof.figures(threads, weights)
    want = invokes * (macs / (f.gmacs * 1e6) + f.overhead_ms)
    assert prof.estimate_ms(macs, invokes, threads, weights) == pytest.approx(want, rel=1e-12)
    assert prof.estimate_ms(macs, invokes, threads, weights) >= invokes * f.overhead_ms


def test_estimate_defaults_to_one_invoke_all_cores_and_fp32():
    prof = toy({1: 1.0, 8: 4.0}, {8: 100.0})
    assert prof.estimate_ms(4_000_000) == pytest.approx(4e6 / 4e9 * 1e3 + 0.08)


def test_estimate_grows_with_macs_and_invokes():
    prof = toy({1: 1.0})
    assert prof.estimate_ms(2_000_000) > prof.estimate_ms(1_000_000)
    assert prof.estimate_ms(1_000_000, invokes=3) == pytest.approx(
        3 * prof.estimate_ms(1_000_000))


@pytest.mark.parametrize("threads, want", [(1, 1), (2, 2), (3, 2), (4, 4), (5, 4), (7, 4),
                                           (8, 8), (None, 8)])
def test_thread_selection_is_the_largest_listed_count_not_above_the_request(threads, want):
    gmacs = {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}
    prof = toy(gmacs)
    assert prof.figures(threads).gmacs == gmacs[want]


def test_none_threads_means_all_cores():
    prof = toy({1: 1.0, 2: 2.0, 6: 6.0}, cores=6)
    assert prof.figures(None) == prof.figures(6) == prof.throughput["fp32"][6]
    sparse = toy({1: 1.0, 2: 2.0}, cores=6)  # no entry at 6: the largest below it
    assert sparse.figures(None) == sparse.throughput["fp32"][2]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_below_the_smallest_listed_count_the_smallest_is_used(threads):
    prof = toy({4: 4.0, 8: 8.0})
    assert prof.figures(threads).gmacs == 4.0


def test_hybrid_uses_int8_when_present_else_fp32():
    with_int8 = toy({1: 1.0, 4: 4.0}, {1: 10.0, 4: 40.0})
    assert with_int8.figures(4, "hybrid").gmacs == 40.0
    assert with_int8.figures(1, "hybrid").gmacs == 10.0
    fp32_only = toy({1: 1.0, 4: 4.0})
    assert fp32_only.figures(4, "hybrid").gmacs == 4.0
    assert fp32_only.estimate_ms(10 ** 6, 1, 4, "hybrid") == fp32_only.estimate_ms(10 ** 6, 1, 4)


@pytest.mark.parametrize("weights", ["dequantize", "float"])
def test_dequantize_and_float_use_fp32_even_when_int8_is_listed(weights):
    prof = toy({1: 1.0, 4: 4.0}, {1: 10.0, 4: 40.0})
    for t in (1, 4, None):
        assert prof.figures(t, weights) == prof.figures(t, "dequantize")
        assert prof.figures(t, weights).gmacs in (1.0, 4.0)


def test_hybrid_below_the_int8_table_falls_back_to_fp32_at_that_thread_count():
    """An all-cores int8 figure says nothing about one thread: a 1-thread hybrid estimate must
    not assume the 4-thread int8 speed (raspberry_pi_4 lists int8 only at 4 threads)."""
    prof = toy({1: 1.0, 4: 4.0}, {4: 40.0})
    for t in (1, 2, 3):
        assert prof.figures(t, "hybrid") == prof.figures(t, "dequantize")
    assert prof.figures(4, "hybrid").gmacs == 40.0
    assert prof.figures(None, "hybrid").gmacs == 40.0
    assert prof.estimate_ms(10 ** 6, 1, 1, "hybrid") >= prof.estimate_ms(10 ** 6, 1, 4, "hybrid")


# --------------------------------------------------------------------------- fit_throughput


@given(gmacs=st.floats(0.05, 500), overhead=st.floats(0, 5),
       macs=st.lists(st.integers(1_000, 10 ** 9), min_size=2, max_size=8, unique=True))
def test_fit_recovers_a_line_exactly(gmacs, overhead, macs):
    ms = [overhead + m / (gmacs * 1e6) for m in macs]
    f = M.fit_throughput(macs, ms)
    assert f.gmacs == pytest.approx(gmacs, rel=1e-6)
    assert f.overhead_ms == pytest.approx(overhead, rel=1e-6, abs=1e-9 * max(ms))


@given(macs=st.integers(1_000, 10 ** 9),
       ms=st.lists(st.floats(0.01, 100), min_size=1, max_size=6))
def test_one_distinct_size_gives_zero_overhead_and_the_mean_rate(macs, ms):
    f = M.fit_throughput([macs] * len(ms), ms)
    assert f.overhead_ms == 0.0
    assert f.gmacs == pytest.approx(len(ms) * macs / (sum(ms) * 1e6), rel=1e-12)
    # the estimate at that size is the mean measurement (one point: that measurement), so the
    # estimates never add up to less than what was measured
    est = macs / (f.gmacs * 1e6)
    assert est == pytest.approx(sum(ms) / len(ms), rel=1e-9)
    assert len(ms) * est >= sum(ms) * (1 - 1e-12)


@given(points=st.lists(st.tuples(st.integers(1_000, 10 ** 8), st.floats(0.001, 50)),
                       min_size=1, max_size=8))
def test_the_fit_is_positive_and_never_optimistic_on_average(points):
    macs, ms = [p[0] for p in points], [p[1] for p in points]
    f = M.fit_throughput(macs, ms)
    assert f.gmacs > 0 and math.isfinite(f.gmacs) and f.overhead_ms >= 0
    # least squares with an intercept, or the total rate: the estimates sum to the measurements
    fitted = [m / (f.gmacs * 1e6) + f.overhead_ms for m in macs]
    assert sum(fitted) == pytest.approx(sum(ms), rel=1e-6)


def test_a_negative_intercept_falls_back_to_the_mean_rate():
    # time falls with size: a line through these has a negative slope
    f = M.fit_throughput([1e6, 2e6], [2.0, 1.0])
    assert f.overhead_ms == 0.0 and f.gmacs == pytest.approx(3e6 / 3e6)


# --------------------------------------------------------------------------- reading and writing


def test_write_then_load_round_trips(tmp_path):
    for prof in (P.profile_from_dict(valid()),
                 P.profile_from_dict(mutated(_set("cpu.max_clock_ghz", None), measured_dict))):
        path = P.write_profile(prof, tmp_path / "sub" / f"{prof.name}.yaml", "# header\n")
        assert path.read_text().startswith("# header\n")
        assert P.load_profile(path) == prof
        assert P.load_profile(str(path)) == prof


def test_write_replaces_an_existing_profile(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("old: contents\n")
    prof = P.profile_from_dict(valid())
    P.write_profile(prof, path)
    assert P.load_profile(path) == prof


def test_an_invalid_profile_is_refused_and_nothing_is_written(tmp_path):
    good = P.profile_from_dict(valid())
    bad = P.DeviceProfile(**{**good.__dict__, "sources": ()})  # published, no sources
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ProfileError, match="sources"):
        P.write_profile(bad, out / "bad.yaml")
    assert list(out.iterdir()) == []  # neither the file nor a temp file


def test_a_refused_write_leaves_the_previous_profile_intact(tmp_path):
    good = P.profile_from_dict(valid())
    path = P.write_profile(good, tmp_path / "p.yaml")
    before = path.read_bytes()
    bad = P.DeviceProfile(**{**good.__dict__, "cores": 0})
    with pytest.raises(ProfileError):
        P.write_profile(bad, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


def test_unknown_name_lists_the_builtins():
    with pytest.raises(ProfileError) as info:
        P.load_profile("no_such_board")
    msg = str(info.value)
    assert "no_such_board" in msg
    names = P.builtin_profiles()
    assert names, "no built-in profiles found"
    for name in names:
        assert name in msg


def test_a_missing_yaml_path_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        P.load_profile(tmp_path / "absent.yaml")


@pytest.mark.parametrize("text", [
    "cpu: [unclosed\n",
    "a: b: c\n",
    "\tkey: 1\n",
    "just a sentence, not a profile\n",
    "- a\n- list\n",
    "",
])
def test_malformed_or_non_profile_yaml_is_a_profile_error(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as info:
        P.load_profile(path)
    assert str(path) in str(info.value)


def test_binary_garbage_is_a_profile_error(tmp_path):
    path = tmp_path / "p.yml"
    path.write_bytes(b"\xff\xfe\x00\x81garbage")
    with pytest.raises(ProfileError):
        P.load_profile(path)


def test_python_tags_are_refused(tmp_path):
    body = yaml.safe_dump(valid(), sort_keys=False)
    path = tmp_path / "evil.yaml"
    path.write_text(body + "extra: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        P.load_profile(path)
    path.write_text(body.replace("description: a test board",
                                 "description: !!python/object:builtins.object {}"))
    with pytest.raises(ProfileError, match="not valid YAML"):
        P.load_profile(path)


# --------------------------------------------------------------------------- built-in profiles

BUILTIN_NAMES = sorted(set(REQUIRED_BUILTINS) | set(P.builtin_profiles()))
# a mapping value that is a number: `key: 1.5`, `{gmacs: 2.9, ...}`, `"4": {...}` is a key
_NUMBER_VALUE = re.compile(
    r"""(?:^|[\s{,])["']?[A-Za-z0-9_.-]+["']?\s*:\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"""
    r"""\s*(?:[,}]|$)""")


def _builtin_path(name: str) -> Path:
    return P.BUILTIN_DIR / f"{name}.yaml"


@pytest.mark.parametrize("name", REQUIRED_BUILTINS)
def test_the_required_builtin_profiles_exist(name):
    assert name in P.builtin_profiles(), f"device_profiles/{name}.yaml is missing"


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtin_profiles_load_are_published_and_cite_sources(name):
    prof = P.load_profile(name)
    assert prof.name == name  # the file name is the name users pass
    assert prof.measured is False
    assert prof.sources and all(s.strip() for s in prof.sources)
    assert prof.bundle_sha256 is None and not prof.latency_ms
    assert prof.max_clock_ghz is not None and prof.max_clock_ghz > 0
    assert P.load_profile(_builtin_path(name)) == prof  # by path too


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_every_number_in_a_builtin_profile_carries_a_source_comment(name):
    """The sourcing rule: a line holding a number states where it came from, in a '#'
    comment on that line or in the comment block directly above it."""
    path = _builtin_path(name)
    assert path.is_file(), f"{path} is missing"
    lines = path.read_text(encoding="utf-8").splitlines()
    uncommented = []
    for i, line in enumerate(lines):
        code = line.split(" #", 1)[0]
        if code.lstrip().startswith("#") or code.lstrip().startswith("schema_version"):
            continue
        if not _NUMBER_VALUE.search(code):
            continue
        above = next((p for p in reversed(lines[:i]) if p.strip()), "")
        if " #" not in line and not above.lstrip().startswith("#"):
            uncommented.append(f"{i + 1}: {line}")
    assert not uncommented, f"{path.name}: numbers without a source comment:\n" + \
        "\n".join(uncommented)


def test_the_number_regex_finds_numbers_and_ignores_text():
    for line in ['  cores: 4', 'ram_mb: 4096', '    "1": {gmacs: 2.9, overhead_ms: 0.2}',
                 '  max_clock_ghz: 1.5', "  '4': {gmacs: 6.5e0, overhead_ms: .4}"]:
        assert _NUMBER_VALUE.search(line), line
    for line in ['  model: Cortex-A72', 'name: raspberry_pi_4', '  arch: arm64',
                 '  - https://example.org/a (Feb 8 2022, 4x Cortex-A72 @ 1.5 GHz)',
                 'description: Raspberry Pi 4 Model B (BCM2711), 64-bit OS', '  fp32:']:
        assert not _NUMBER_VALUE.search(line), line


@pytest.mark.parametrize("name", BUILTIN_NAMES)
@pytest.mark.parametrize("weights", ["dequantize", "hybrid"])
def test_builtin_estimates_do_not_grow_with_more_threads(name, weights):
    prof = P.load_profile(name)
    macs = 300_000_000  # MobileNet v2 1.0/224, the net most published figures are for
    est = [prof.estimate_ms(macs, 1, t, weights) for t in range(1, prof.cores + 1)]
    assert all(b <= a for a, b in itertools.pairwise(est)), est
    assert prof.estimate_ms(macs, 1, None, weights) == est[-1]


# --------------------------------------------------------------------------- runtime integration


def _fallback(c) -> float:
    return c.invokes * (c.macs / (FALLBACK_GMACS * 1e6) + FALLBACK_OVERHEAD_MS)


def _load(bundle, **kw):
    return edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB, **kw)


@pytest.mark.parametrize("threads", [None, 1, 4])
def test_a_named_profile_seeds_the_priors_with_its_estimate(bundle, threads):
    m = _load(bundle, profile="raspberry_pi_4", threads=threads)
    prof = P.load_profile("raspberry_pi_4")
    assert m.profile == prof
    assert "raspberry_pi_4" in m.latency_source
    for c in m.manifest.configurations:
        assert m.policy.prior_latency_ms(c) == prof.estimate_ms(c.macs, c.invokes, threads,
                                                                c.weights)
        # end to end: the profile's invoke estimate plus the SDK's own time, measured at load
        assert m.policy.predicted_latency_ms(c) == \
            m.policy.prior_latency_ms(c) + m.policy.overhead_ms(c)
        assert 0 < m.policy.overhead_ms(c) < 5


def test_a_profile_path_works_like_a_name(bundle, tmp_path):
    d = valid()
    path = P.write_profile(P.profile_from_dict(d), tmp_path / "board.yaml")
    m = _load(bundle, profile=path)
    assert "toy_board" in m.latency_source
    for c in m.manifest.configurations:
        assert m.policy.prior_latency_ms(c) == m.profile.estimate_ms(c.macs, c.invokes, None,
                                                                     c.weights)


def test_an_unknown_profile_name_fails_the_load(bundle):
    with pytest.raises(ProfileError, match="raspberry_pi_4"):
        _load(bundle, profile="no_such_board")


def test_no_profile_uses_the_manifest_latencies_or_the_fallback(bundle):
    m = _load(bundle, profile=None)
    assert m.profile is None and m.latency_source == "manifest"
    for c in m.manifest.configurations:
        want = c.latency_ms if c.latency_ms is not None else _fallback(c)
        assert m.policy.prior_latency_ms(c) == want


@pytest.fixture(scope="module")
def measured(bundle):
    prof, rows = M.measure_profile(bundle, [1], repeats=2)
    return prof, rows


def test_measure_profile_measures_every_configuration(bundle, measured):
    prof, rows = measured
    manifest = read_manifest(bundle)
    assert prof.measured and prof.bundle_sha256 == M.manifest_sha256(bundle)
    assert set(prof.latency_ms) == {1}
    assert set(prof.latency_ms[1]) == set(manifest.ids)
    assert all(v > 0 for v in prof.latency_ms[1].values())
    assert {(r["threads"], r["config"]) for r in rows} == {(1, i) for i in manifest.ids}
    for r in rows:
        assert r["measured_ms"] == prof.latency_ms[1][r["config"]] and r["fitted_ms"] > 0
    assert 1 in prof.throughput["fp32"] and prof.throughput["fp32"][1].gmacs > 0


def test_measured_profile_round_trips_through_write_and_load(measured, tmp_path):
    prof, _ = measured
    path = P.write_profile(prof, tmp_path / "m.yaml")
    assert P.load_profile(path) == prof


def test_auto_uses_the_manifest_until_the_bundle_is_profiled_then_the_measurements(
        bundle, measured, private_cache):
    before = _load(bundle, threads=1)  # profile="auto" is the default
    assert before.profile is None and before.latency_source == "manifest"
    assert M.find_cached(bundle) is None

    prof, _ = measured
    path = P.write_profile(prof, M.cached_profile_path(bundle))
    assert path.is_relative_to(private_cache)
    assert M.find_cached(bundle) == prof

    after = _load(bundle, threads=1)
    assert after.profile == prof and after.latency_source.startswith("measured profile")
    for c in after.manifest.configurations:
        assert after.policy.prior_latency_ms(c) == prof.latency_ms[1][c.id]
    # with no thread count: the largest measured one (here the only one)
    default = _load(bundle)
    assert default.latency_source.startswith("measured profile")


def test_auto_at_an_unmeasured_thread_count_uses_the_profile_estimate(bundle, measured,
                                                                     private_cache):
    prof, _ = measured
    if prof.cores < 2:
        pytest.skip("a one-core host has no second thread count")
    P.write_profile(prof, M.cached_profile_path(bundle))
    m = _load(bundle, threads=2)
    assert "MACs estimate" in m.latency_source
    for c in m.manifest.configurations:
        assert m.policy.prior_latency_ms(c) == prof.estimate_ms(c.macs, c.invokes, 2, c.weights)


def _reexported(bundle: Path, dst: Path) -> Path:
    """A copy of ``bundle`` whose manifest differs harmlessly (one temperature)."""
    shutil.copytree(bundle, dst)
    data = read_manifest(dst).to_dict()
    data["configurations"][0]["temperature"] *= 1.001
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    return dst


def test_a_cached_profile_for_another_manifest_is_ignored(bundle, measured, tmp_path,
                                                        private_cache):
    prof, _ = measured
    other = _reexported(bundle, tmp_path / "reexported")
    assert M.manifest_sha256(other) != M.manifest_sha256(bundle)
    # the measured profile of the original, planted where the re-export's would be
    P.write_profile(prof, M.cached_profile_path(other))
    assert M.find_cached(other) is None
    m = _load(other, threads=1)
    assert m.profile is None and m.latency_source == "manifest"
    # and named explicitly, its latency table (another bundle's) is not used either
    path = P.write_profile(prof, tmp_path / "orig.yaml")
    m = _load(other, profile=path, threads=1)
    assert "MACs estimate" in m.latency_source
    for c in m.manifest.configurations:
        assert m.policy.prior_latency_ms(c) == prof.estimate_ms(c.macs, c.invokes, 1, c.weights)


# --------------------------------------------------------------------------- edge-sdk profile


def test_profile_command_writes_a_loadable_measured_profile(bundle, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert profile_main([str(bundle), "--repeats", "2", "--threads", "1", "--out", str(out),
                         "--name", "ci_host"]) == 0
    printed = capsys.readouterr().out
    assert str(out) in printed
    prof = P.load_profile(out)
    assert prof.measured and prof.name == "ci_host"
    assert prof.bundle_sha256 == M.manifest_sha256(bundle)
    assert set(prof.latency_ms) == {1}
    assert set(prof.latency_ms[1]) == set(read_manifest(bundle).ids)
    assert out.read_text().startswith("# Written by `edge-sdk profile`")
    m = _load(bundle, profile=out, threads=1)
    assert m.latency_source == "measured profile ci_host"


def test_profile_command_defaults_to_the_cache(bundle, private_cache, capsys):
    assert profile_main([str(bundle), "--repeats", "1", "--threads", "1"]) == 0
    assert M.cached_profile_path(bundle).is_file()
    assert M.find_cached(bundle) is not None
    assert _load(bundle, threads=1).latency_source.startswith("measured profile")


@pytest.mark.parametrize("threads", ["999", "0", "1,999"])
def test_profile_command_refuses_thread_counts_beyond_the_host(bundle, tmp_path, threads):
    out = tmp_path / "p.yaml"
    with pytest.raises(ProfileError, match="between 1 and"):
        profile_main([str(bundle), "--repeats", "1", "--threads", threads, "--out", str(out)])
    assert not out.exists()


def test_profile_command_refuses_non_integer_thread_counts(bundle, tmp_path):
    with pytest.raises(ProfileError, match="--threads"):
        profile_main([str(bundle), "--threads", "one", "--out", str(tmp_path / "p.yaml")])


def test_measure_profile_refuses_zero_repeats(bundle):
    with pytest.raises(ProfileError, match="repeats"):
        M.measure_profile(bundle, [1], repeats=0)
