"""A tiny JSON Schema validator for sidecar/cli/schema.json: the subset it uses (type, enum,
properties, required, additionalProperties, items, allOf, anyOf, local $ref). No dependency,
so the schema test runs on any machine bin/test sets up; `violations` names each path that fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "sidecar" / "cli" / "schema.json"
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
_KNOWN = {"type", "enum", "properties", "required", "additionalProperties", "items", "allOf", "anyOf", "$ref",
          "description", "title", "$schema", "$id", "$defs", "commands"}


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def violations(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    """Each way `value` breaks `schema` (refs resolve in `root`), as "path: why"; [] when it conforms."""
    unknown = set(schema) - _KNOWN
    assert not unknown, f"the tiny validator does not know {sorted(unknown)} (at {path}); extend it"
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/$defs/"), ref
        return violations(value, root["$defs"][ref[len("#/$defs/"):]], root, path)
    out: list[str] = []
    for sub in schema.get("allOf", []):
        out += violations(value, sub, root, path)
    if "anyOf" in schema and all(violations(value, sub, root, path) for sub in schema["anyOf"]):
        out.append(f"{path}: matches none of anyOf")
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, n) for n in names):
            return out + [f"{path}: {value!r} is not of type {' or '.join(names)}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                out += violations(item, props[key], root, f"{path}.{key}")
            elif extra is False:
                out.append(f"{path}: unexpected {key!r}")
            elif isinstance(extra, dict):
                out += violations(item, extra, root, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += violations(item, schema["items"], root, f"{path}[{i}]")
    return out


def check(value: Any, name: str) -> None:
    """Fail unless `value` conforms to `$defs/<name>` of the CLI's schema."""
    root = load_schema()
    problems = violations(value, root["$defs"][name], root)
    assert not problems, f"{name}: " + "; ".join(problems[:10])


def check_command(value: Any, command: str) -> None:
    """Fail unless `value` conforms to the schema of `command`'s output ("replica ls", ...)."""
    root = load_schema()
    problems = violations(value, root["commands"][command], root)
    assert not problems, f"{command}: " + "; ".join(problems[:10])
