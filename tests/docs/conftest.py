"""tests/docs: the checkout the documentation's code blocks run in (docs_support.py)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def docs_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once per session; needs torch (a digits model is trained and exported)."""
    pytest.importorskip("torch", exc_type=ImportError)
    from docs_support import build_checkout

    return build_checkout(tmp_path_factory.mktemp("docs_checkout"))
