"""Workstation side: layers, models, data, training. ``trainer.nest(module, ...)`` converts a
user's plain network into a nested Bayesian one (:mod:`trainer.nesting`)."""


def __getattr__(name: str):
    # lazy: ``import trainer`` stays free of torch until nest is asked for
    if name == "nest":
        from trainer.nesting import nest

        return nest
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
