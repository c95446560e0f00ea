"""Config files and overrides: built-in names or YAML paths read safely, ``a.b=value``
overrides checked against the schema and applied to the plain data before validation.

Generic over the root config dataclass (``trainer.config.Config``, passed in as ``root``), so
this module never imports the sections; :func:`trainer.config.load_config` and
:func:`trainer.config.apply_overrides` put it together.
"""
from __future__ import annotations

import dataclasses
import os
import typing
from importlib import resources
from typing import Any

import yaml

from edge_sdk.errors import ConfigError
from trainer.config_validate import _join, _section_type, _unknown_key, _value_desc

__all__ = ["list_builtin_configs"]


def _configs_dir() -> Any:
    # importlib.resources so built-ins are found when installed as package data (even zipped)
    return resources.files(__package__ or "trainer").joinpath("configs")


def list_builtin_configs() -> list[str]:
    """Names accepted by load_config, e.g. ['cifar10', 'digits', 'fashion_mnist']."""
    return sorted(p.name[: -len(".yaml")] for p in _configs_dir().iterdir() if p.name.endswith(".yaml"))


def _looks_like_path(name: str) -> bool:
    return "/" in name or os.sep in name or name.endswith((".yaml", ".yml"))


def _read_config_text(name_or_path: str) -> tuple[str, str]:
    """(YAML text, description for messages) of a built-in name or a file path."""
    builtins = list_builtin_configs()
    if not _looks_like_path(name_or_path) and name_or_path in builtins:
        text = _configs_dir().joinpath(f"{name_or_path}.yaml").read_text(encoding="utf-8")
        return text, f"built-in config '{name_or_path}'"
    path = os.path.expanduser(name_or_path)
    if not os.path.isfile(path):
        raise ConfigError(
            f"config '{name_or_path}' is neither a built-in config nor an existing YAML file; "
            f"built-in configs: {', '.join(builtins)}"
        )
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(), f"config file '{name_or_path}'"
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file '{name_or_path}': {exc}") from exc


def _parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)  # safe_load only: a config must never construct objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"cannot parse {where}{at}: {problem}") from exc


def _override_path(key: str, override: str, root: type) -> list[str]:
    """Check a dotted override key against the schema of ``root``; returns its parts."""
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise ConfigError(f"malformed override '{override}': expected section.key=value, e.g. train.epochs=3")
    cls: Any = root
    path = ""
    for i, part in enumerate(parts):
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        if part not in fields:
            raise _unknown_key(path, part, list(fields))
        path = _join(path, part)
        tp = typing.get_type_hints(cls)[part]
        rest = parts[i + 1 :]
        if not rest:
            break
        section = _section_type(tp)
        if section is not None:
            cls = section
        elif tp is dict or typing.get_origin(tp) is dict:
            break  # model.kwargs.input_size=8 sets a key inside the free-form mapping
        else:
            raise ConfigError(
                f"override '{override}': '{path}' is a value, not a section, so '{key}' does not exist"
            )
    return parts


def _apply_override(data: dict[str, Any], override: str, root: type) -> None:
    """Set one ``section.key=value`` override (value parsed as YAML) in the plain ``data`` of a
    ``root`` config, the key checked against ``root``'s schema first."""
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"malformed override '{override}': expected section.key=value, e.g. train.epochs=3")
    parts = _override_path(key, override, root)
    value = _parse_yaml(text.strip(), f"override '{override}'")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"override '{override}': '{where}' must be a mapping, got {_value_desc(child)}")
        node = child
    node[parts[-1]] = value
