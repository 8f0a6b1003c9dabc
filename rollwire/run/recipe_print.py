"""`rollwire run --print-recipe`: a recipe as TOML with every setting, its value and its doc, written
from the settings models themselves, so the printout cannot drift from the code.

    # The event log: `type = "embedded"` (default path `<run_dir>/log`) or `"kafka"`.
    [bus]
    type = "embedded"
    # Directory of the log; created if missing.
    path = "runs/demo/log"

A setting whose value is unset (None) is printed commented out, since TOML has no null.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel


def recipe_toml(recipe: BaseModel) -> str:
    """Every field of `recipe`, tables after the plain values, each preceded by its docstring."""
    lines: list[str] = []
    _table(recipe, [], lines)
    return "\n".join(lines).strip() + "\n"


def _doc(model: BaseModel, name: str) -> list[str]:
    text = type(model).model_fields[name].description or ""
    return [f"# {line}".rstrip() for line in text.splitlines()]


def _table(model: BaseModel, path: list[str], lines: list[str]) -> None:
    nested: list[tuple[str, Any]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel) or (isinstance(value, list) and value and isinstance(value[0], BaseModel)):
            nested.append((name, value))
            continue
        lines += _doc(model, name)
        key = _key(name)
        lines.append(f"# {key} =   (unset)" if value is None else f"{key} = {_value(value)}")
    for name, value in nested:
        lines.append("")
        lines += _doc(model, name)
        if isinstance(value, BaseModel):
            lines.append(f"[{'.'.join(_key(p) for p in [*path, name])}]")
            _table(value, [*path, name], lines)
        else:
            for item in value:
                lines.append(f"[[{'.'.join(_key(p) for p in [*path, name])}]]")
                _table(item, [*path, name], lines)


def _key(name: str) -> str:
    return name if name.replace("_", "").replace("-", "").isalnum() else json.dumps(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else json.dumps(str(value))
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))
    if isinstance(value, BaseModel):
        return _value({k: v for k, v in value.model_dump(mode="json").items() if v is not None})
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items() if v is not None) + " }" \
            if value else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(str(value))
