"""bundle_bytes counts every byte in the bundle directory (issue 21's bundle size)."""
from __future__ import annotations

import pytest

from edge_sdk.errors import ConfigError
from exporters.export import bundle_bytes


def test_every_file_counts(tmp_path):
    b = tmp_path / "b"
    b.mkdir()
    (b / "store.bin").write_bytes(b"x" * 1000)
    (b / "manifest.yaml").write_bytes(b"y" * 300)
    (b / ".hidden").write_bytes(b"z" * 7)
    (b / "sub").mkdir()
    (b / "sub" / "extra.tflite").write_bytes(b"w" * 11)
    assert bundle_bytes(b) == 1000 + 300 + 7 + 11
    (tmp_path / "outside").write_bytes(b"o" * 5000)
    (b / "link").symlink_to(tmp_path / "outside")
    assert bundle_bytes(b) == 1318  # a symlink's target is not the bundle's
    with pytest.raises(ConfigError, match="not a bundle directory"):
        bundle_bytes(tmp_path / "missing")
