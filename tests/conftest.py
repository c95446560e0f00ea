"""Shared test setup. Must not import torch: the runtime tests run where torch is absent.

``EDGE_SDK_BLOCK_TORCH=1`` makes torch and the workstation packages unimportable for the whole
session, so CI can prove the device-side tests (tests/edge_sdk) need none of them.
"""
import importlib.abc
import os
import sys

from hypothesis import settings

# Shared CI machines are slow and noisy; a per-example deadline only adds flaky failures.
settings.register_profile("edge", deadline=None, max_examples=50)
settings.load_profile("edge")

_BLOCKED = ("torch", "torchvision", "trainer", "exporters")


class _BlockWorkstation(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            raise ImportError(f"{name} is blocked (EDGE_SDK_BLOCK_TORCH=1: device-side run)")
        return None


if os.environ.get("EDGE_SDK_BLOCK_TORCH") == "1":
    sys.meta_path.insert(0, _BlockWorkstation())
