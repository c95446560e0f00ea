"""Shared test setup. Must not import torch: the runtime tests run where torch is absent."""
from hypothesis import settings

# Shared CI machines are slow and noisy; a per-example deadline only adds flaky failures.
settings.register_profile("edge", deadline=None, max_examples=50)
settings.load_profile("edge")
