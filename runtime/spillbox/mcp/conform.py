"""A structuredContent that a tool's outputSchema accepts, carrying a notice.

MCP clients hold a tool that declares an outputSchema to it: the SDK clients raise when
such a tool returns no structuredContent, or one that does not validate. An offloaded
result must therefore still carry a conforming value; it carries the notice in the first
string the schema asks for (server-filesystem's `{content: string}` gets the notice as its
content), minimal values elsewhere, and, where the schema has no string to hold it and
allows other properties, under NOTICE_KEY.

    value = conforming({"type": "object", "properties": {"content": {"type": "string"}},
                        "required": ["content"]}, notice)   # {"content": notice}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NOTICE_KEY = "spillbox_notice"
_MAX_DEPTH = 16


def conforming(schema: Mapping[str, Any], notice: str) -> dict[str, Any] | None:
    """A value that schema accepts with the notice in it, or None if none could be made."""
    filler = _Filler(schema, notice)
    value = filler.fill(schema, 0)
    if not isinstance(value, dict):
        return None
    if not filler.placed and schema.get("additionalProperties", True) is not False:
        value[NOTICE_KEY] = notice
    return value if valid(schema, value) else None


def valid(schema: Mapping[str, Any], value: Any) -> bool:
    """Whether schema (a JSON Schema) accepts value; False for a schema that is not valid."""
    # jsonschema (about 3 MiB) is loaded by the first result that needs it, not by every
    # proxy at start: most tools declare no outputSchema.
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for
    from referencing import Registry
    from referencing.exceptions import Unresolvable

    try:
        cls = validator_for(schema)
        cls.check_schema(schema)
        return bool(cls(schema, registry=Registry()).is_valid(value))
    except (SchemaError, Unresolvable):
        return False


class _Filler:
    def __init__(self, root: Mapping[str, Any], notice: str) -> None:
        self.root = root
        self.notice = notice
        self.placed = False

    def fill(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
            return None
        if "$ref" in schema:
            return self.fill(self._resolve(str(schema["$ref"])), depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                return self._first_option(schema[key], depth)
        if schema.get("allOf"):
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                merged.update(part if isinstance(part, Mapping) else {})
            return self.fill(merged, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [str(k) for k in kind]
            kind = "string" if "string" in kinds else next((k for k in kinds if k != "null"), None)
        if kind is None and "properties" in schema:
            kind = "object"
        return self._of_type(kind, schema, depth)

    def _of_type(self, kind: Any, schema: Mapping[str, Any], depth: int) -> Any:
        if kind == "object":
            properties: Mapping[str, Any] = schema.get("properties", {})
            required = [str(name) for name in schema.get("required", ())]
            value = {name: self.fill(properties.get(name, {}), depth + 1) for name in required}
            if not self.placed:  # an optional string can hold the notice as well
                for name, sub in properties.items():
                    if name not in value and isinstance(sub, Mapping) and _is_string(sub):
                        value[name] = self.fill(sub, depth + 1)
                        break
            return value
        if kind == "array":
            return [self.fill(schema.get("items", {}), depth + 1)] * int(schema.get("minItems", 0))
        if kind == "string":
            if self.placed:
                return ""
            self.placed = True
            return self.notice
        if kind in ("integer", "number"):
            return schema.get("minimum", 0)
        if kind == "boolean":
            return False
        return None

    def _first_option(self, options: Any, depth: int) -> Any:
        for option in options if isinstance(options, list) else ():
            placed = self.placed
            value = self.fill(option, depth + 1)
            if isinstance(option, Mapping) and valid(option, value):
                return value
            self.placed = placed
        return None

    def _resolve(self, ref: str) -> Any:
        node: Any = self.root
        if not ref.startswith("#"):
            return None
        for part in ref.lstrip("#").strip("/").split("/"):
            if not part:
                continue
            if not isinstance(node, Mapping):
                return None
            node = node.get(part.replace("~1", "/").replace("~0", "~"))
        return node


def _is_string(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "string" or (isinstance(kind, list) and "string" in kind)
