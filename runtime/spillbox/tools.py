"""The model-facing tools: sandbox_exec, read_artifact, list_artifacts and search_artifacts.

    toolset = Toolset(task)                       # registers: notices' hints name these tools
    request["tools"] += toolset.definitions("openai")   # or "responses", "anthropic"
    output = toolset.call("read_artifact", {"path": "/sandbox/offload/c1.json"})
    output.text                                   # what the model sees (JSON)
    toolset.call("read_artifact", {"artifact_id": "c1", "start": 40, "limit": 5, "fields": ["id"]})

Once registered, a notice's hints name exactly these tools, with ready-to-send arguments.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from spillbox.codemode import DEFAULT_TIMEOUT
from spillbox.errors import SpillboxError
from spillbox.langs import LANGS
from spillbox.notice import Hint
from spillbox.paging import (
    CURSOR_TTL_SECONDS,
    PAGE_UNITS_MAX,
    CursorError,
    CursorSigner,
    Page,
    page,
    records_path,
)
from spillbox.profile import parse_path, path_text
from spillbox.search import DEFAULT_TOP_K, MAX_TOP_K, search
from spillbox.types import Image

if TYPE_CHECKING:
    from spillbox.protocols import TaskHandle
    from spillbox.types import Artifact, ArtifactRow

SANDBOX_EXEC = "sandbox_exec"
READ_ARTIFACT = "read_artifact"
LIST_ARTIFACTS = "list_artifacts"
SEARCH_ARTIFACTS = "search_artifacts"
"""Named apart from a bare "search", which a user's own tools often are (the loop refuses a
user tool that reuses one of spillbox's names)."""
TOOL_NAMES = (SANDBOX_EXEC, READ_ARTIFACT, LIST_ARTIFACTS, SEARCH_ARTIFACTS)
PREFIX = "spillbox_"
"""Put before a tool's name where another tool of the model's set already has that name
(an MCP server's own tool, behind `spillbox mcp proxy`)."""
NAMESPACE_END = "__"
"""Where a client shows an MCP server's tools under a namespace of its own (Claude Code:
mcp__<server>__<tool>), the tool's own name follows the last NAMESPACE_END."""

Format = Literal["openai", "responses", "anthropic"]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it is for, and its arguments as JSON Schema.

    >>> spec = ToolSpec("ping", "Is the service up?", {"type": "object"})
    >>> spec.definition("responses")["strict"]
    False
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    strict: bool = False
    """True when parameters follow OpenAI's strict-mode rules (every property required,
    optional ones nullable, no additional properties): the OpenAI shapes then say
    "strict": true and the API holds the model's arguments to the schema. spillbox's own
    tools are strict; a user's tool is sent as not strict unless it says so."""

    def definition(self, fmt: Format) -> dict[str, Any]:
        """The tool in a provider's shape."""
        if fmt == "openai":
            return {
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": dict(self.parameters),
                    "strict": self.strict,
                },
            }
        if fmt == "responses":
            # The Responses API makes a schema strict when "strict" is left out: a tool that
            # is not strict has to say so.
            return {
                "type": "function",
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
                "strict": self.strict,
            }
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": dict(self.parameters),
        }


def _optional(kind: str, description: str) -> dict[str, Any]:
    """An optional argument as strict mode has it: always sent, null when not given."""
    return {"type": [kind, "null"], "description": description}


# Strict mode (OpenAI): every property is listed in required, an optional one is nullable
# and a null means "not given"; no object takes additional properties; no keyword outside
# strict mode's subset (defaults and bounds are said in descriptions instead).
SPECS: dict[str, ToolSpec] = {
    SANDBOX_EXEC: ToolSpec(
        SANDBOX_EXEC,
        "Run a script in this task's sandbox, where offloaded tool results are files under "
        "/sandbox/offload/. sql is DuckDB: every JSON, NDJSON or CSV artifact is a table named "
        'after its artifact id (quote it: SELECT count(*) FROM "c1"). jq runs a filter over '
        "one artifact (give artifact). python has duckdb, pyarrow and jq. sh has jq, grep, "
        "head, tail. Only what the script prints comes back; a large print becomes a new "
        "artifact with a notice. No network. Write files to /sandbox/work (capped; lost if the "
        "sandbox restarts). With session true, python runs as a cell of this task's "
        "persistent session, like a notebook: names defined by earlier session calls are "
        "still there, a last expression is printed, duckdb, pa (pyarrow) and jq are imported, "
        "and con (duckdb's default connection) has every JSON, NDJSON or CSV artifact as a "
        "table named after its id.",
        {
            "type": "object",
            "properties": {
                "lang": {"type": "string", "enum": list(LANGS)},
                "code": {"type": "string", "description": "The script (for jq: the filter)."},
                "artifact": _optional(
                    "string",
                    "For jq: the artifact id or path to run the filter over; null otherwise.",
                ),
                "timeout": _optional("number", f"Seconds; null for {DEFAULT_TIMEOUT:g}."),
                "session": _optional(
                    "boolean",
                    "python only: true runs the code in this task's persistent session, false "
                    "in a fresh process; null for this task's default.",
                ),
                "reset_session": _optional(
                    "boolean",
                    "python only: true empties the persistent session first, then runs the "
                    "code in it; null or false keeps it.",
                ),
            },
            "required": ["lang", "code", "artifact", "timeout", "session", "reset_session"],
            "additionalProperties": False,
        },
        strict=True,
    ),
    READ_ARTIFACT: ToolSpec(
        READ_ARTIFACT,
        "Read an offloaded artifact one page at a time: whole records of a JSON array or "
        "NDJSON (items), else whole lines of text (text). A JSON object that wraps records "
        "(a notice's records: line) pages those records: first its envelope (the other "
        "keys), then the records as items. Pass the path from a notice or the artifact_id; "
        "pass next_cursor back as cursor for the next page. Steer it: limit takes fewer "
        f"records or lines (1 to {PAGE_UNITS_MAX}; null: as many as fit in a page), start "
        "jumps to a record or line, fields keeps only some keys of each record (or columns "
        "of a CSV). A CSV's pages after the first start with its header again (their "
        "first header_lines lines). A page says how many it returned, where it lies "
        "(position) and whether more follow (has_more): continue only if you need more. "
        "Where sandbox_exec is "
        "offered, one query counts, filters or searches many records: page through only "
        "what you must read.",
        {
            "type": "object",
            "properties": {
                "path": _optional("string", "The path a notice shows; null to use artifact_id."),
                "artifact_id": _optional("string", "The artifact's id; null to use path."),
                "cursor": _optional(
                    "string",
                    "next_cursor of the previous page (it keeps that page's records, fields "
                    "and limit); null for the first page or with start.",
                ),
                "records": _optional(
                    "string",
                    "For a JSON object: the path of the array to page, as a notice's records: "
                    'line writes it (data.search.nodes; a key with dots as ["a.b"]); null for '
                    "its largest array of records.",
                ),
                "limit": _optional(
                    "integer",
                    f"At most this many records or lines on the page, 1 to {PAGE_UNITS_MAX}; "
                    "null for as many as fit in a page. The page is never over the per-call "
                    "limit, whatever this asks.",
                ),
                "start": _optional(
                    "integer",
                    "The record or line to start at (0 is the first; for binary, the byte), "
                    "as position counts; null for the beginning, or where cursor is.",
                ),
                "fields": {
                    "type": ["array", "null"],
                    "items": {"type": "string"},
                    "description": "Keep just these top-level keys of each record (JSON "
                    "arrays, NDJSON, wrapped records), or these columns of a CSV (its rows "
                    "then come as records, start counting rows); null for whole records. "
                    "Not for text.",
                },
            },
            "required": [
                "path",
                "artifact_id",
                "cursor",
                "records",
                "limit",
                "start",
                "fields",
            ],
            "additionalProperties": False,
        },
        strict=True,
    ),
    LIST_ARTIFACTS: ToolSpec(
        LIST_ARTIFACTS,
        "List this task's offloaded artifacts: id, path, tool, bytes, tokens.",
        {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
        strict=True,
    ),
    SEARCH_ARTIFACTS: ToolSpec(
        SEARCH_ARTIFACTS,
        "Find lines holding every word of a query (case-insensitive) in this task's text "
        "artifacts and its history of earlier turns (one JSON message a line; read_artifact "
        'with artifact_id "spillbox:history" opens it). Returns short snippets, best first, '
        "each with its artifact_id and its line (the record's position, as read_artifact "
        "counts) and offset.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "The words to find."},
                "top_k": _optional(
                    "integer", f"How many snippets, 1 to {MAX_TOP_K}; null for {DEFAULT_TOP_K}."
                ),
                "artifact": _optional(
                    "string", "An artifact id or path to search alone; null for all."
                ),
            },
            "required": ["query", "top_k", "artifact"],
            "additionalProperties": False,
        },
        strict=True,
    ),
}


@dataclass(frozen=True)
class ToolOutput:
    """What a spillbox tool returns to the model."""

    text: str
    is_error: bool = False
    offloadable: bool = True
    """False for read_artifact pages: already bounded, and offloading one would loop."""
    images: tuple[Image, ...] = ()
    """Images to show the model after the text (sandbox_exec: files and figures a script
    left); each adapter gives them in its provider's shape."""


def tool_names(languages: Sequence[str], taken: Collection[str] = ()) -> tuple[str, ...]:
    """The tools a task offers, as the model sees them: sandbox_exec only where the sandbox
    runs code mode; a name already taken by another tool gets PREFIX."""
    names = (name for name in TOOL_NAMES if languages or name != SANDBOX_EXEC)
    return tuple(PREFIX + name if name in taken else name for name in names)


def specs_of(names: Sequence[str]) -> list[ToolSpec]:
    """The specs of spillbox's tools as the model sees them named (tool_names)."""
    return [replace(SPECS[canonical(name)], name=name) for name in names]


def canonical(name: str) -> str:
    """spillbox's own name for a tool the model sees as name (with or without PREFIX, or
    under a client's namespace)."""
    bare = name.rpartition(NAMESPACE_END)[2].removeprefix(PREFIX)
    return bare if bare in TOOL_NAMES else name


class Toolset:
    """spillbox's tools for one task, and the dispatcher the loop calls them through.

    >>> toolset = Toolset(task)  # doctest: +SKIP
    >>> toolset.call("list_artifacts", {}).text  # doctest: +SKIP
    '[]'
    """

    def __init__(
        self,
        task: TaskHandle,
        taken: Collection[str] = (),
        python_session: bool = False,
        *,
        register: bool = True,
        namespace: str = "",
    ) -> None:
        """taken: names of the model's other tools; one of ours that has such a name is
        offered as PREFIX + name (and notices' hints say so).
        python_session: this task's default for python calls that do not say (session
        null): run them in the task's persistent session.
        register: tell the task these are the tools its model is offered, so notices'
        hints name them (task.register_tools); False for a toolset that is not offered.
        namespace: what the model sees before each name, where a client shows the tools
        under a namespace (Claude Code's mcp__spillbox__ for an MCP server named spillbox):
        the hints name the tools with it; calls still come by the bare names."""
        self.task = task
        self.python_session = python_session
        self.names = tool_names(task.languages, taken)
        self._signer = CursorSigner(task.home)
        if register:
            task.register_tools(namespace + name for name in self.names)

    def specs(self) -> list[ToolSpec]:
        return specs_of(self.names)

    def definitions(self, fmt: Format = "openai") -> list[dict[str, Any]]:
        return [spec.definition(fmt) for spec in self.specs()]

    def call(self, name: str, arguments: Mapping[str, Any] | str) -> ToolOutput:
        """Call a tool as the model would; errors come back as text, as the model sees them."""
        try:
            if name not in self.names:
                return _error(f"unknown tool {name!r}: available are {', '.join(self.names)}")
            name = canonical(name)
            args = _object(name, arguments)
            args = _arguments(SPECS[name], args)
            if name == SANDBOX_EXEC:
                return self._exec(args)
            if name == READ_ARTIFACT:
                return self._read(args)
            if name == SEARCH_ARTIFACTS:
                return self._search(args)
            return self._list()
        except SpillboxError as e:
            return _error(str(e))
        except (ValueError, TypeError, KeyError, OverflowError) as e:
            # OverflowError: a number too large for a float ({"timeout": 1e400 as digits}).
            return _error(f"bad arguments for {name}: {e}")

    def _exec(self, args: dict[str, Any]) -> ToolOutput:
        reset = bool(args.get("reset_session", False))
        python = args["lang"] == "python"
        result = self.task.exec(
            args["lang"],
            str(args["code"]),
            timeout=float(args.get("timeout", DEFAULT_TIMEOUT)),
            artifact=args.get("artifact"),
            session=bool(args.get("session", python and self.python_session)) or reset,
            reset_session=reset,
        )
        body = json.dumps(result.as_json(), ensure_ascii=False)
        return ToolOutput(body, is_error=result.exit_code != 0, images=result.images)

    def _read(self, args: dict[str, Any]) -> ToolOutput:
        ref = args.get("artifact_id") or args.get("path")
        if not ref:
            raise ValueError("give path (as a notice shows it) or artifact_id")
        task = self.task
        row = task.artifact(str(ref))
        expect: dict[str, Any] = {
            "task": task.id,
            "artifact": row.artifact_id,
            "sha": row.sha256[:16],
        }
        asked = parse_path(str(args["records"])) if args.get("records") is not None else None
        units = _whole_number(args, "limit", 1, PAGE_UNITS_MAX)
        first = _whole_number(args, "start", 0, None)
        fields = _keys(args.get("fields"))
        start: tuple[int, int] | None = None
        if args.get("cursor"):
            if first is not None:
                raise ValueError(
                    "give cursor or start, not both: cursor reads on from the last page, "
                    "start from the record or line it names"
                )
            kept = self._signer.check(str(args["cursor"]), expect)
            start = (int(kept["pos"][0]), int(kept["pos"][1]))
            asked = _kept(kept, "records", asked, "records path")
            # Fields too: a slice's offsets count the characters of the records as cut down.
            fields = _kept(kept, "fields", fields, "fields")
            units = units if units is not None else kept.get("limit")
        data = task.read(row, actor=READ_ARTIFACT)
        kind = row.kind or _kind(row.name)
        path = records_path(data, row.sha256, kind, asked)
        expect["records"] = None if path is None else list(path)
        if fields is not None:
            expect["fields"] = list(fields)
        if units is not None:
            expect["limit"] = units
        limit = self._content_limit(row, expect, path, fields)
        slice_ = page(
            data,
            row.sha256,
            kind,
            start,
            task.counter,
            limit,
            path,
            units=units,
            first=first,
            fields=fields,
            name=row.name,
        )
        next_cursor = self._cursor(expect, slice_) if slice_.has_more else None
        return ToolOutput(_body(row, slice_, next_cursor), offloadable=False)

    def _search(self, args: dict[str, Any]) -> ToolOutput:
        # Held to the per-call limit, as a page is, and never offloaded (it is bounded).
        body = search(
            self.task,
            str(args["query"]),
            args.get("top_k"),
            args.get("artifact"),
            budget=self.task.policy.per_call_tokens,
        )
        return ToolOutput(json.dumps(body, ensure_ascii=False), offloadable=False)

    def _content_limit(
        self,
        row: ArtifactRow,
        expect: dict[str, Any],
        path: tuple[str, ...] | None,
        fields: tuple[str, ...] | None,
    ) -> int:
        """The tokens a page's content may take: the page shares the per-call threshold
        with the JSON around it, whose path, fields and cursor can be long; the content
        gets what the largest such envelope leaves."""
        most = row.bytes
        widest = Page(
            "bytes", (most, most), (2 * most, most), most, None, "", True, path, None, fields, most
        )
        envelope = self.task.counter.count(_body(row, widest, self._cursor(expect, widest)))
        per_call = self.task.policy.per_call_tokens
        if fields is not None and envelope * 2 > per_call:
            # The fields go into every page and its cursor: so many that they take half
            # the page would leave no room for the records they pick.
            raise ValueError(
                f"fields names {len(fields)} keys, too many for a page to carry: name fewer"
            )
        return max(per_call - envelope, 1)

    def _cursor(self, expect: dict[str, Any], slice_: Page) -> str:
        """The signed position where slice_ ends, with what the reader asked for."""
        return self._signer.sign(
            {
                **expect,
                "pos": list(slice_.end),
                "unit": slice_.unit,
                "exp": int(time.time() + CURSOR_TTL_SECONDS),
            }
        )

    def _list(self) -> ToolOutput:
        rows = [
            {
                "artifact_id": row.artifact_id,
                "path": row.path,
                "tool": row.tool,
                "call_id": row.call_id,
                "bytes": row.bytes,
                "tokens": row.tokens,
            }
            for row in self.task.artifacts()
        ]
        return ToolOutput(json.dumps(rows, ensure_ascii=False))


def tool_hints(plain: Sequence[Hint], artifact: Artifact, tools: frozenset[str]) -> list[Hint]:
    """The notice's hints as calls of the registered tools, by the names the model sees
    (code-mode hints otherwise)."""
    if not tools:
        return list(plain)
    visible = {canonical(name): name for name in tools}
    hints: list[Hint] = []
    if SANDBOX_EXEC in visible and plain and plain[0].lang in LANGS:
        first = plain[0]
        args = {"lang": first.lang, "code": first.code}
        hints.append(Hint(first.lang, first.code, visible[SANDBOX_EXEC], args))
    if READ_ARTIFACT in visible:
        hints.append(Hint("", "", visible[READ_ARTIFACT], {"path": artifact.path}))
    return hints


def _body(row: ArtifactRow, slice_: Page, next_cursor: str | None) -> str:
    """read_artifact's result: the page, where it lies, and how to get the next one."""
    body: dict[str, Any] = {"artifact_id": row.artifact_id, "path": row.path}
    if slice_.records is not None:
        body["records"] = path_text(slice_.records)
    if slice_.fields is not None:
        body["fields"] = list(slice_.fields)
    if slice_.header:
        body["header_lines"] = slice_.header
    if slice_.items is not None:
        body["items"] = slice_.items
    elif slice_.envelope is not None:
        body["envelope"] = slice_.envelope
    else:
        body["text"] = slice_.text
        if slice_.unit == "bytes":
            body["encoding"] = "base64"
    body.update(
        {
            "unit": slice_.unit,
            "position": _position(slice_.start, slice_.end),
            "total": slice_.total,
            "returned": slice_.returned,
            "partial": slice_.partial,
            "has_more": slice_.has_more,
            "next_cursor": next_cursor,
        }
    )
    return json.dumps(body, ensure_ascii=False)


def _position(start: tuple[int, int], end: tuple[int, int]) -> dict[str, int]:
    """Where the page lies: record/line/byte indexes, plus character offsets inside one
    record or line when the page is a slice of it."""
    position = {"start": start[0], "end": end[0]}
    if start[1] or end[1]:
        position.update(start_offset=start[1], end_offset=end[1])
    return position


def _kept(
    kept: Mapping[str, Any], key: str, given: tuple[str, ...] | None, what: str
) -> tuple[str, ...] | None:
    """What a cursor was made for (its records path or fields): a call that names other
    ones is refused, for the cursor's position is in the pages those made."""
    made_for = tuple(kept[key]) if kept.get(key) is not None else None
    if given is not None and given != made_for:
        raise CursorError(
            f"cursor belongs to another {what}: pass the same {key} as the page it came "
            f"from, or null; or give start (without cursor) with the new {key}"
        )
    return made_for


def _whole_number(args: Mapping[str, Any], name: str, low: int, high: int | None) -> int | None:
    """An integer argument within its bounds, or None when not given."""
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"{low} to {high}" if high is not None else f"{low} or more"
        raise ValueError(f"{name} must be {bound}, not {value}")
    return value


def _keys(value: Any) -> tuple[str, ...] | None:
    """The fields argument: a list of key names, or None when not given."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"fields must be a list of key names, not {value!r}")
    return tuple(value)


def _kind(name: str) -> str:
    """The shape kind of an artifact recorded before its kind was kept, from its extension."""
    extension = name.rsplit(".", 1)[-1]
    return {"json": "json_array", "ndjson": "ndjson"}.get(extension, "text")


EXAMPLES: dict[str, dict[str, Any]] = {
    SANDBOX_EXEC: {"lang": "sql", "code": 'SELECT count(*) FROM "c1"'},
    READ_ARTIFACT: {"artifact_id": "c1"},
    LIST_ARTIFACTS: {},
    SEARCH_ARTIFACTS: {"query": "timeout", "top_k": None, "artifact": None},
}
"""A call's arguments for each tool, shown when a caller sends something that is not a
JSON object."""


def _object(name: str, arguments: Mapping[str, Any] | str) -> dict[str, Any]:
    """The arguments as a dict; anything but a JSON object is refused with an example."""
    example = json.dumps(EXAMPLES[name])
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError as e:
            raise ValueError(
                f"the arguments must be a JSON object, for example {example} ({e})"
            ) from None
    else:
        decoded = arguments
    if not isinstance(decoded, Mapping):
        got = type(decoded).__name__
        raise ValueError(f"the arguments must be a JSON object, for example {example}, not {got}")
    return dict(decoded)


def _arguments(spec: ToolSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments, checked against the spec's names; a null is an argument not given
    (under strict mode the model sends every argument, null for the ones it leaves out)."""
    properties: Mapping[str, Any] = spec.parameters.get("properties", {})
    unknown = set(given) - set(properties)
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(sorted(unknown))}")
    args = {name: value for name, value in given.items() if value is not None}
    missing = [
        name
        for name in spec.parameters.get("required", ())
        if name not in args and not _nullable(properties[name])
    ]
    if missing:
        raise ValueError(f"missing argument(s) {', '.join(missing)}")
    return args


def optional_nulls(spec: ToolSpec) -> dict[str, Any]:
    """spec's parameters for a client that checks a call's arguments against the schema
    without strict mode: a nullable argument may be left out (a null is one not given)."""
    properties: Mapping[str, Any] = spec.parameters.get("properties", {})
    required = [n for n in spec.parameters.get("required", ()) if not _nullable(properties[n])]
    return {**spec.parameters, "required": required}


def _nullable(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type", ())
    kinds = [kind] if isinstance(kind, str) else list(kind)
    return "null" in kinds or any(_nullable(option) for option in schema.get("anyOf", ()))


def _error(message: str) -> ToolOutput:
    return ToolOutput(
        json.dumps({"error": message}, ensure_ascii=False), is_error=True, offloadable=False
    )
