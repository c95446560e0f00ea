"""Shared trained model for the trainer tests (torch is imported lazily, inside fixtures)."""
import pytest


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory):
    """One short digits training run shared by every test that needs a trained model.

    Sized to take about a minute on 2 cores; the tests assert behaviour, never the time.
    """
    from trainer.config import load_config
    from trainer.train import train

    cfg = load_config("digits", ["train.epochs=12", "train.eval_every=100"])
    out = tmp_path_factory.mktemp("digits_run")
    return cfg, train(cfg, out, progress=False, log=lambda *a, **k: None)
