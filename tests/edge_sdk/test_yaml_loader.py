"""The YAML loader edge_sdk reads manifests and device profiles with: libyaml's C parser when
PyYAML has it (6-7x faster on a 105 kB store manifest), always the *safe* constructor (plain
data, never an object). Every guarantee is checked with both loaders, the C one and the
pure-Python fallback."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_bundle import manifest_dict

import edge_sdk.bundle.reading as reading
import edge_sdk.policy.profiles as profiles
from edge_sdk.bundle import Manifest, manifest_to_yaml
from edge_sdk.errors import BundleError, ProfileError

LOADERS = [yaml.SafeLoader] + ([yaml.CSafeLoader] if yaml.__with_libyaml__ else [])


@pytest.mark.parametrize("module", [reading, profiles])
def test_the_loader_is_the_safe_one_on_libyaml_when_present(module):
    loader = module.SAFE_LOADER
    assert loader is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    assert issubclass(loader, yaml.constructor.SafeConstructor)
    assert not issubclass(loader, yaml.constructor.FullConstructor)  # (Unsafe derives from it)


@pytest.fixture(params=LOADERS, ids=lambda c: c.__name__)
def loader(request, monkeypatch):
    monkeypatch.setattr(reading, "SAFE_LOADER", request.param)
    monkeypatch.setattr(profiles, "SAFE_LOADER", request.param)
    return request.param


def _parse(text: str) -> Manifest:
    return reading._parse_manifest_text(text.encode("utf-8"), "manifest.yaml")


def test_both_loaders_read_a_manifest_the_same(loader):
    m = Manifest.from_dict(manifest_dict())
    assert _parse(manifest_to_yaml(m)) == m


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.mkdir", "!!python/object/new:os.mkdir",
                                 "!!python/name:os.mkdir"])
def test_python_tags_are_refused_without_executing(loader, tmp_path: Path, tag: str):
    marker = tmp_path / "pwned"
    with pytest.raises(BundleError, match="invalid YAML at line 2"):
        _parse(f"schema_version: 1\nsource: {tag} [{str(marker)!r}]\n")
    assert not marker.exists()
    profile = tmp_path / "evil.yaml"
    profile.write_text(f"schema_version: 1\nextra: {tag} [{str(marker)!r}]\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        profiles.load_profile(profile)
    assert not marker.exists()


def test_anchors_and_deep_nesting_are_refused(loader):
    with pytest.raises(BundleError, match=r"YAML anchor &a at line 2, column 9"):
        _parse("schema_version: 1\nsource: &a {x: 1}\nlabels: *a\n")
    for deep in ("[" * 200 + "]" * 200, "{a: " * 200 + "1" + "}" * 200):
        with pytest.raises(BundleError, match="nested more than 64 levels deep"):
            _parse(f"schema_version: 1\nsource: {deep}\n")
