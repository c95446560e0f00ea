"""trainer.config: built-in configs, overrides, round trips and error messages."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk.errors import ConfigError
from trainer.config import (
    Config,
    DataConfig,
    ModelConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    dump_config,
    list_builtin_configs,
    load_config,
    validate,
)

BUILTINS = list_builtin_configs()


def _write(tmp_path, text: str, name: str = "cfg.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _assert_plain(value) -> None:
    """Only types yaml.safe_dump and torch.load(weights_only=True) accept without help."""
    if isinstance(value, dict):
        assert all(isinstance(k, str) for k in value)
        for v in value.values():
            _assert_plain(v)
    elif isinstance(value, list):
        for v in value:
            _assert_plain(v)
    else:
        assert value is None or type(value) in (bool, int, float, str), repr(value)


# --------------------------------------------------------------------------- built-ins and round trips


def test_builtin_names():
    assert {"digits", "fashion_mnist", "cifar10"} <= set(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_loads_and_round_trips(name, tmp_path):
    cfg = load_config(name)
    assert cfg.name == name
    d = config_to_dict(cfg)
    _assert_plain(d)
    assert config_from_dict(d) == cfg
    text = dump_config(cfg)
    assert config_from_dict(yaml.safe_load(text)) == cfg
    assert load_config(_write(tmp_path, text)) == cfg


@pytest.mark.parametrize("name", list_builtin_configs())
def test_builtin_file_values_override_defaults(name):
    """Every key a built-in YAML states ends up in the loaded config; the rest are defaults."""
    from importlib import resources

    text = resources.files("trainer").joinpath("configs", f"{name}.yaml").read_text()
    stated = yaml.safe_load(text)
    loaded = config_to_dict(load_config(name))
    defaults = config_to_dict(Config())

    def check(stated, loaded, defaults, path):
        for key, v in stated.items():
            if isinstance(v, dict) and isinstance(defaults.get(key), dict) and key != "kwargs":
                check(v, loaded[key], defaults[key], f"{path}{key}.")  # a nested section
            else:
                assert loaded[key] == v, f"{path}{key}"
        for key in set(defaults) - set(stated):
            assert loaded[key] == defaults[key], f"{path}{key}"

    check(stated, loaded, defaults, "")


def test_none_is_the_defaults_and_missing_keys_take_defaults(tmp_path):
    assert load_config(None) == Config()
    cfg = load_config(_write(tmp_path, "train:\n  epochs: 3\nbayes:\n"))  # empty section -> defaults
    assert cfg.train.epochs == 3
    assert cfg.train.batch_size == TrainConfig().batch_size
    assert cfg.data == DataConfig()
    assert load_config(_write(tmp_path, "# nothing differs\n")) == Config()


def test_from_dict_converts_int_to_float_and_round_trips_exactly():
    cfg = config_from_dict({"train": {"lr": 1, "eval_widths": [1]}, "model": {"kwargs": {"a": [1, {"b": None}]}}})
    assert type(cfg.train.lr) is float and cfg.train.eval_widths == [1.0]
    assert type(cfg.train.eval_widths[0]) is float
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert config_from_dict(yaml.safe_load(dump_config(cfg))) == cfg


def test_config_to_dict_is_a_deep_copy():
    cfg = load_config("digits", ["model.kwargs={a: [1]}"])
    d = config_to_dict(cfg)
    d["model"]["kwargs"]["a"].append(2)
    d["train"]["eval_widths"].append(0.1)
    assert cfg.model.kwargs == {"a": [1]} and cfg.train.eval_widths == [0.25, 0.5, 0.75, 1.0]


# --------------------------------------------------------------------------- overrides


def test_overrides_scalars_lists_and_nested():
    cfg = load_config(
        "digits",
        [
            "train.epochs=3",
            "train.eval_widths=[0.5,1.0]",
            "model.kwargs={input_size: 8, dims: [4, 8]}",
            "model.kwargs.extra=true",
            "train.lr=1e-4",  # YAML 1.1 reads this as a string; float fields accept it
            "train.threads=2",
            "train.grad_clip=null",
            "data.source=npz:/tmp/some file.npz",
            "ordering.hard=false",
            " seed = 7 ",
        ],
    )
    assert cfg.train.epochs == 3
    assert cfg.train.eval_widths == [0.5, 1.0]
    assert cfg.model.kwargs == {"input_size": 8, "dims": [4, 8], "extra": True}
    assert cfg.train.lr == pytest.approx(1e-4) and type(cfg.train.lr) is float
    assert (cfg.train.threads, cfg.train.grad_clip) == (2, None)
    assert cfg.data.source == "npz:/tmp/some file.npz"
    assert cfg.ordering.hard is False and cfg.seed == 7


def test_single_string_override_is_not_split_into_characters():
    assert load_config("digits", "train.epochs=4").train.epochs == 4


def test_exponent_float_in_file(tmp_path):
    assert load_config(_write(tmp_path, "train:\n  lr: 1e-3\n")).train.lr == pytest.approx(1e-3)


@pytest.mark.parametrize("override", ["train.epochs", "=3", "train..epochs=1", ".epochs=1", "train.=2"])
def test_malformed_override(override):
    with pytest.raises(ConfigError, match="malformed override") as err:
        load_config("digits", [override])
    assert override in str(err.value)


def test_override_into_a_value_is_rejected():
    with pytest.raises(ConfigError, match=r"'train\.epochs' is a value"):
        load_config("digits", ["train.epochs.x=1"])


def test_unparseable_override_value():
    with pytest.raises(ConfigError, match=r"train\.eval_widths=\[0\.5"):
        load_config("digits", ["train.eval_widths=[0.5"])


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=-5, max_value=10_000))
def test_epochs_override_property(epochs):
    if epochs >= 1:
        cfg = load_config(None, [f"train.epochs={epochs}"])
        assert cfg.train.epochs == epochs
        assert config_from_dict(config_to_dict(cfg)) == cfg
    else:
        with pytest.raises(ConfigError, match=r"train\.epochs.*>= 1"):
            load_config(None, [f"train.epochs={epochs}"])


# --------------------------------------------------------------------------- error messages


@pytest.mark.parametrize("how", ["override", "file"])
def test_unknown_key_names_dotted_key_and_suggests(how, tmp_path):
    with pytest.raises(ConfigError) as err:
        if how == "override":
            load_config("digits", ["train.epocs=3"])
        else:
            load_config(_write(tmp_path, "train:\n  epocs: 3\n"))
    msg = str(err.value)
    assert "'train.epocs'" in msg
    assert "did you mean 'train.epochs'" in msg
    assert "batch_size" in msg and "eval_widths" in msg  # the allowed keys of the section


def test_unknown_top_level_key_and_no_suggestion():
    with pytest.raises(ConfigError, match=r"did you mean 'train'") as err:
        config_from_dict({"trian": {}})
    assert "top level" in str(err.value) and "ordering" in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown config key 'model\.zzzzqq'") as err:
        load_config("digits", ["model.zzzzqq=1"])
    assert "did you mean" not in str(err.value)


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("train.epochs=true", r"train\.epochs: expected int, got bool True"),
        ("train.epochs=3.0", r"train\.epochs: expected int, got float 3\.0"),
        ("train.lr=fast", r"train\.lr: expected float, got str 'fast'"),
        ("train.lr='0.5'", r"train\.lr: expected float, got str '0\.5'"),
        ("train.lr=.inf", r"train\.lr: expected a finite number"),
        ("train.epochs=null", r"train\.epochs: expected int, got null"),
        ("train.threads=two", r"train\.threads: expected int or null, got str 'two'"),
        ("data.download=1", r"data\.download: expected bool, got int 1"),
        ("train.eval_widths=0.5", r"train\.eval_widths: expected list of float, got float 0\.5"),
        ("train.eval_widths=[0.5, a]", r"train\.eval_widths\[1\]: expected float, got str 'a'"),
        ("model.kwargs=[1]", r"model\.kwargs: expected mapping, got list"),
        ("model.kwargs={1: 2}", r"model\.kwargs: mapping keys must be strings"),
        ("train=3", r"section 'train' must be a mapping"),
    ],
)
def test_wrong_type(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config("digits", [override])


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("train.epochs=-1", r"train\.epochs: must be >= 1; got -1"),
        ("train.epochs=0", r"train\.epochs: must be >= 1; got 0"),
        ("ordering.prior_pi=1", r"ordering\.prior_pi: must be > 0\.0 and < 1\.0; got 1\.0"),
        ("data.val_fraction=0.5", r"data\.val_fraction: must be > 0\.0 and < 0\.5; got 0\.5"),
        ("train.lr=0", r"train\.lr: must be > 0"),
        ("train.optimizer=adamw", r"train\.optimizer: must be one of adam, sgd; got 'adamw'"),
        ("bayes.prior=laplace", r"bayes\.prior: must be one of log_uniform, gaussian, none"),
        ("data.source=imagenet", r"data\.source: must be one of digits, .*npz:<path>, imagefolder:<path>"),
        ("train.eval_widths=[0.5, 1.5]", r"train\.eval_widths\[1\]: must be > 0\.0 and <= 1\.0; got 1\.5"),
        ("train.eval_widths=[]", r"train\.eval_widths: needs at least 1"),
        ("train.grad_clip=0", r"train\.grad_clip: must be > 0"),
    ],
)
def test_out_of_range(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config("digits", [override])


def test_cross_field_checks():
    with pytest.raises(ConfigError, match=r"model\.frozen \(9\) must be <= model\.groups \(8\)"):
        load_config("digits", ["model.frozen=9"])
    assert load_config("digits", ["model.frozen=8"]).model.frozen == 8
    with pytest.raises(ConfigError, match=r"ordering\.tau_end .* must be <= ordering\.tau_start"):
        load_config("digits", ["ordering.tau_end=2.0"])
    with pytest.raises(ConfigError, match=r"data\.image_size is required"):
        load_config("digits", ["data.source=imagefolder:/some/dir"])
    cfg = load_config("digits", ["data.source=imagefolder:/some/dir", "data.image_size=32"])
    assert cfg.data.image_size == 32


def test_unparseable_yaml_names_file_and_line(tmp_path):
    path = _write(tmp_path, "train:\n  epochs: 3\n  lr: [0.1\nbayes:\n  kappa: 1\n", "broken.yaml")
    with pytest.raises(ConfigError, match=r"broken\.yaml.* line \d+") as err:
        load_config(path)
    assert "cannot parse" in str(err.value)


@pytest.mark.parametrize("text", ["- train\n- data\n", "just a string\n", "3\n"])
def test_top_level_must_be_mapping(text, tmp_path):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, text))


def test_missing_file_lists_builtins(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config("no_such_config")
    assert all(name in str(err.value) for name in BUILTINS)
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config(str(tmp_path / "missing.yaml"))


def test_python_tags_are_rejected_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    path = _write(tmp_path, f'name: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(path)
    assert not marker.exists()


def test_validate_catches_python_built_configs():
    with pytest.raises(ConfigError, match=r"train\.epochs: must be >= 1"):
        validate(Config(train=TrainConfig(epochs=0)))
    with pytest.raises(ConfigError, match=r"^data\.source"):
        validate(DataConfig(source="nope"), "data")
    with pytest.raises(ConfigError, match=r"model\.kwargs\.t: expected plain YAML value"):
        config_to_dict(Config(model=ModelConfig(kwargs={"t": (1, 2)})))


@dataclass
class QuantizeConfig:  # what another engineer's section looks like: metadata only, no validator code
    bits: int = field(default=4, metadata={"min": 1, "max": 8})
    method: str = field(default="pwfn", metadata={"choices": ("pwfn", "sqs")})


@dataclass
class ExtendedConfig(Config):
    quantize: QuantizeConfig = field(default_factory=QuantizeConfig)


def test_a_new_section_is_validated_by_its_metadata_alone():
    assert validate(ExtendedConfig()).quantize == QuantizeConfig()
    with pytest.raises(ConfigError, match=r"quantize\.bits: must be >= 1 and <= 8; got 9"):
        validate(ExtendedConfig(quantize=QuantizeConfig(bits=9)))
    with pytest.raises(ConfigError, match=r"quantize\.method: must be one of pwfn, sqs"):
        validate(ExtendedConfig(quantize=QuantizeConfig(method="x")))
