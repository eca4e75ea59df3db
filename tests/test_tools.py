"""The model-facing tools with sandbox="none": definitions (checked against the provider
SDKs' own types and OpenAI's strict mode), read_artifact paging and its cursors,
list_artifacts, and the hints a notice prints once the tools are registered."""

from __future__ import annotations

import base64
import functools
import json
import random
import re
import stat
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import typing_extensions
from anthropic.types import ToolParam as AnthropicToolParam
from openai.types.chat import ChatCompletionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import TypeAdapter, ValidationError

from api_shapes import github_search, slack_history
from conftest import joined_text, read_all_pages
from spillbox import Admitted, Harness, Policy, ToolResult, parse_notice
from spillbox.codemode import DEFAULT_TIMEOUT
from spillbox.langs import LANGS
from spillbox.paging import CURSOR_TTL_SECONDS, SECRET_FILE
from spillbox.tools import SPECS, Toolset, ToolSpec
from spillbox.types import ExecResult

# Small enough that modest payloads offload and paging takes a few pages; large enough
# that a page's JSON envelope (paths, cursor) leaves room for content.
LIMIT = 1_500
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def open_harness(home: Path, per_call: int = LIMIT) -> Harness:
    # No environment, no background collector: tests see only what they set.
    policy = Policy(per_call_tokens=per_call, aggregate_tokens=max(per_call, 10_000))
    return Harness(sandbox="none", home=home, environ={}, gc_interval=-1, policy=policy)


@pytest.fixture
def harness(home: Path) -> Iterator[Harness]:
    with open_harness(home) as h:
        yield h


def offload(task: Any, call_id: str, content: str | bytes, tool: str = "t") -> Admitted:
    [admitted] = task.admit([ToolResult(call_id=call_id, tool=tool, content=content)])
    assert admitted.offloaded and admitted.artifact is not None, admitted.text
    return admitted


def read_pages(toolset: Toolset, limit: int, **ref: str) -> list[dict[str, Any]]:
    """Every page of an artifact, following next_cursor; checks each page's bounds."""
    counter = toolset.task.harness.counter
    pages = read_all_pages(toolset, **ref)
    for output, body in pages:
        assert not output.offloadable  # a page never goes back through the aggregate rule
        assert counter.count(output.text) <= limit, "a page is over the per-call threshold"
        assert body["has_more"] is (body["next_cursor"] is not None)
    return [body for _, body in pages]


def offloaded_pages(
    harness: Harness, task_id: str, call_id: str, payload: str, limit: int = LIMIT
) -> list[dict[str, Any]]:
    """Offload payload as call_id in a new task, then read every page of it back."""
    with harness.task(task_id) as task:
        offload(task, call_id, payload)
        return read_pages(Toolset(task), limit, artifact_id=call_id)


# The provider SDKs' own types


SDK_TOOL_TYPES: dict[str, Any] = {
    "openai": ChatCompletionToolParam,
    "responses": FunctionToolParam,
    "anthropic": AnthropicToolParam,
}


@functools.cache
def adapter(sdk_type: Any) -> TypeAdapter[Any]:
    # Kept alive on purpose: pydantic checks an Iterable's items only as it is consumed,
    # and consuming one after its adapter is gone crashes pydantic-core.
    return TypeAdapter(sdk_type)


def assert_sdk_shape(value: Any, sdk_type: Any) -> None:
    """value is what the provider SDK's type accepts: pydantic validates it (every Iterable
    consumed, which is when pydantic checks its items), and at every level a TypedDict gets
    all its required keys and no key it does not declare (pydantic lets those through)."""
    consume(adapter(sdk_type).validate_python(value))
    problems = shape_problems(value, sdk_type, "$")
    assert not problems, problems


def consume(value: Any) -> None:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple | Iterator):
        for item in value:
            consume(item)


def shape_problems(value: Any, tp: Any, path: str) -> list[str]:
    """Where value does not have the shape of tp: a key its TypedDict does not declare, a
    required one missing, a literal or a class that does not match. Pydantic checks the
    values; this checks the keys it lets by."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Annotated, typing.Required, typing.NotRequired):
        return shape_problems(value, args[0], path)
    if origin in (typing.Union, types.UnionType):
        # The member value is meant as: the fewest problems with value itself (a string
        # is not a list), then the fewest below it.
        fits = [shape_problems(value, member, path) for member in args]
        return min(
            fits, key=lambda found: (sum(p.startswith(f"{path}:") for p in found), len(found))
        )
    if origin is typing.Literal:
        return [] if value in args else [f"{path}: {value!r} is not one of {args}"]
    if typing_extensions.is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: not a {tp.__name__}"]
        hints = typing_extensions.get_type_hints(tp, include_extras=True)
        problems = [f"{path}.{key}: not a key of {tp.__name__}" for key in value.keys() - hints]
        problems += [
            f"{path}.{key}: required by {tp.__name__}" for key in required_keys(tp) - value.keys()
        ]
        for key in value.keys() & hints.keys():
            problems += shape_problems(value[key], hints[key], f"{path}.{key}")
        return problems
    kind = origin or tp
    if isinstance(kind, type) and issubclass(kind, Mapping):
        return [] if isinstance(value, dict) else [f"{path}: not an object"]
    if len(args) == 1:  # a list, Iterable or Sequence of one type
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [
            p for i, item in enumerate(value) for p in shape_problems(item, args[0], f"{path}[{i}]")
        ]
    if tp in (typing.Any, object) or not isinstance(tp, type):
        return []
    # A class: str, None, or one of the SDK's response models (a request holds dicts).
    if not isinstance(value, (int, float) if tp is float else tp):
        return [f"{path}: not a {tp.__name__}"]
    return []


def required_keys(tp: Any) -> set[str]:
    """A TypedDict's required keys. Its __required_keys__ cannot tell: the SDKs write
    Required[...] in annotations that `from __future__ import annotations` leaves as
    strings, so the keys are read from the resolved hints."""
    return {
        key
        for key, hint in typing_extensions.get_type_hints(tp, include_extras=True).items()
        if typing.get_origin(hint) is typing.Required
        or (tp.__total__ and typing.get_origin(hint) is not typing.NotRequired)
    }


# OpenAI's strict mode, from its Structured Outputs guide ("Supported schemas"): the root is
# an object, not anyOf; every object sets additionalProperties: false and lists every
# property in required (an optional one is nullable instead); at most 10 levels of nesting
# and 5,000 properties; only a subset of JSON Schema. This checker allows only the keywords
# below (not default, format, pattern, minimum/maximum, min/maxLength, allOf, oneOf, not,
# if/then/else, patternProperties: unsupported, or not on every model): a constraint goes
# into the description. Add a keyword only after checking that guide.
STRICT_KEYWORDS = {
    "type", "description", "enum", "properties", "required", "additionalProperties",
    "items", "anyOf",
}  # fmt: skip
STRICT_MAX_DEPTH = 10
STRICT_MAX_PROPERTIES = 5_000
JSON_TYPES = {"object": dict, "string": str, "number": (int, float), "integer": int,
              "boolean": bool, "array": list, "null": type(None)}  # fmt: skip


def assert_strict(schema: Any) -> None:
    """A tool's parameters are valid under OpenAI's strict mode, at every level."""
    assert schema.get("type") == "object" and "anyOf" not in schema, "the root is an object"
    count = check_strict(schema, "$", depth=1)
    json.dumps(schema)  # serialisable as sent
    assert count <= STRICT_MAX_PROPERTIES


def check_strict(schema: Any, path: str, depth: int) -> int:
    """Asserts the strict rules on schema and below; returns how many properties it has."""
    assert isinstance(schema, dict), f"{path}: a schema is an object"
    assert depth <= STRICT_MAX_DEPTH, f"{path}: nested deeper than {STRICT_MAX_DEPTH}"
    unsupported = set(schema) - STRICT_KEYWORDS
    assert not unsupported, f"{path}: keywords outside strict mode's subset: {unsupported}"
    if "description" in schema:
        assert isinstance(schema["description"], str) and schema["description"], path
    if "anyOf" in schema:
        assert "type" not in schema, f"{path}: anyOf and type together"
        return sum(
            check_strict(option, f"{path}.anyOf[{i}]", depth)
            for i, option in enumerate(schema["anyOf"])
        )
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    assert kinds and set(kinds) <= set(JSON_TYPES) and len(set(kinds)) == len(kinds), path
    if "enum" in schema:
        values = schema["enum"]
        assert values and len({json.dumps(v) for v in values}) == len(values), path
        allowed = tuple(JSON_TYPES[kind] for kind in kinds)
        assert all(isinstance(v, allowed) for v in values), f"{path}: enum outside its type"
        assert ("null" in kinds) == (None in values), f"{path}: a nullable enum lists null"
    count = 0
    if "object" in kinds:
        properties = schema.get("properties")
        assert isinstance(properties, dict), f"{path}: an object lists its properties"
        assert schema.get("additionalProperties") is False, f"{path}: additionalProperties"
        required = schema.get("required")
        assert isinstance(required, list) and len(set(required)) == len(required), path
        assert set(required) == set(properties), f"{path}: every property is required"
        count += len(properties)
        for name, prop in properties.items():
            assert isinstance(name, str) and name, path
            count += check_strict(prop, f"{path}.{name}", depth + 1)
    else:
        assert not {"properties", "required", "additionalProperties"} & set(schema), path
    if "array" in kinds:
        count += check_strict(schema.get("items"), f"{path}[]", depth + 1)
    else:
        assert "items" not in schema, path
    return count


def check_definitions(definitions: list[dict[str, Any]], fmt: str) -> list[str]:
    """Checks every definition against the SDK's type for fmt and strict mode; returns the
    tool names, in order."""
    names = []
    for definition in definitions:
        assert_sdk_shape(definition, SDK_TOOL_TYPES[fmt])
        if fmt == "openai":
            inner, schema = definition["function"], definition["function"]["parameters"]
        elif fmt == "responses":
            inner, schema = definition, definition["parameters"]
        else:
            inner, schema = definition, definition["input_schema"]
        if fmt != "anthropic":
            assert inner["strict"] is True
        assert NAME.match(inner["name"]), inner["name"]
        assert isinstance(inner["description"], str) and len(inner["description"]) > 20
        assert_strict(schema)
        names.append(inner["name"])
    return names


# Definitions


@pytest.mark.parametrize("fmt", ["openai", "responses", "anthropic"])
def test_definitions_are_valid_in_every_shape_and_name_only_available_tools(
    harness: Harness, fmt: str
) -> None:
    with harness.task("defs") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        names = check_definitions(toolset.definitions(fmt), fmt)  # type: ignore[arg-type]
    # sandbox="none" has no code mode: sandbox_exec must not be offered.
    assert names == ["read_artifact", "list_artifacts", "search_artifacts"]
    assert task.tools == frozenset(names)


def nullable(spec: ToolSpec) -> set[str]:
    """The spec's optional arguments: the ones a null may stand for."""
    return {
        name
        for name, prop in spec.parameters["properties"].items()
        if "null" in (prop.get("type") or ())
        or any(option.get("type") == "null" for option in prop.get("anyOf", ()))
    }


def test_read_artifact_schema_offers_path_artifact_id_cursor_records_and_steering(
    harness: Harness,
) -> None:
    with harness.task("defs") as task:
        [read] = [s for s in Toolset(task).specs() if s.name == "read_artifact"]
    assert isinstance(read, ToolSpec)
    names = ["path", "artifact_id", "cursor", "records", "limit", "start", "fields"]
    assert list(read.parameters["properties"]) == names
    # Strict mode lists them all as required; each is nullable: path or artifact_id is
    # checked at the call.
    assert read.parameters["required"] == names
    assert nullable(read) == set(names)


def test_a_backend_with_code_mode_offers_sandbox_exec(harness: Harness) -> None:
    # The Docker backend's languages, without Docker: the toolset follows the backend.
    harness.backend.languages = LANGS
    with harness.task("defs") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        for fmt in ("openai", "responses", "anthropic"):
            names = check_definitions(toolset.definitions(fmt), fmt)  # type: ignore[arg-type]
            assert names == ["sandbox_exec", "read_artifact", "list_artifacts", "search_artifacts"]
        [spec] = [s for s in toolset.specs() if s.name == "sandbox_exec"]
        assert spec.parameters["required"] == [
            "lang",
            "code",
            "artifact",
            "timeout",
            "session",
            "reset_session",
        ]
        assert nullable(spec) == {"artifact", "timeout", "session", "reset_session"}
        assert spec.parameters["properties"]["lang"]["enum"] == list(LANGS)


def test_every_tool_is_strict_in_the_cli_and_the_toolset_alike() -> None:
    for spec in SPECS.values():
        assert spec.strict
        assert_strict(spec.parameters)
        for fmt in ("openai", "responses", "anthropic"):
            check_definitions([spec.definition(fmt)], fmt)  # type: ignore[arg-type]


def test_a_users_tool_is_sent_as_not_strict() -> None:
    # A user's schema need not follow strict mode: saying "strict": true for it would get
    # the request rejected, and leaving "strict" out of a Responses tool makes it strict.
    spec = ToolSpec("list_prs", "List the PRs.", {"type": "object", "properties": {}})
    chat, responses = spec.definition("openai"), spec.definition("responses")
    assert chat["function"]["strict"] is False and responses["strict"] is False
    assert_sdk_shape(chat, ChatCompletionToolParam)
    assert_sdk_shape(responses, FunctionToolParam)
    assert_sdk_shape(spec.definition("anthropic"), AnthropicToolParam)


def strict_schema() -> dict[str, Any]:
    """A schema valid under strict mode, with a nested object and an array, to break."""
    return {
        "type": "object",
        "properties": {
            "q": {"type": "string", "description": "The query."},
            "limit": {"type": ["integer", "null"]},
            "mode": {"type": ["string", "null"], "enum": ["fast", "exact", None]},
            "filter": {
                "type": "object",
                "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
                "required": ["tags"],
                "additionalProperties": False,
            },
            "since": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["q", "limit", "mode", "filter", "since"],
        "additionalProperties": False,
    }


def test_the_strict_checker_accepts_a_strict_schema() -> None:
    assert_strict(strict_schema())


@pytest.mark.parametrize(
    ("why", "path", "value"),
    [
        ("optional, not required", ("required",), ["q", "limit", "mode", "filter"]),
        ("extra properties allowed", ("additionalProperties",), True),
        ("nested extras allowed", ("properties", "filter", "additionalProperties"), True),
        ("nested optional", ("properties", "filter", "required"), []),
        ("a default", ("properties", "limit", "default"), 10),
        ("a bound", ("properties", "limit", "minimum"), 1),
        ("a format", ("properties", "q", "format"), "date-time"),
        ("a pattern", ("properties", "q", "pattern"), "^a"),
        ("oneOf", ("properties", "since", "oneOf"), [{"type": "string"}]),
        ("nullable enum without null", ("properties", "mode", "enum"), ["fast", "exact"]),
        ("an unknown type", ("properties", "q", "type"), "str"),
        ("an array without items", ("properties", "filter", "properties", "tags", "items"), None),
        ("anyOf at the root", ("anyOf",), [{"type": "object"}]),
    ],
)
def test_the_strict_checker_rejects_what_strict_mode_rejects(
    why: str, path: tuple[str, ...], value: Any
) -> None:
    schema = strict_schema()
    holder = functools.reduce(lambda node, key: node[key], path[:-1], schema)
    if value is None:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    with pytest.raises(AssertionError):
        assert_strict(schema)


@pytest.mark.parametrize(
    ("fmt", "change"),
    [
        ("openai", lambda d: d.update(strict=True)),  # strict belongs inside function
        ("openai", lambda d: d["function"].update(input_schema={})),
        ("openai", lambda d: d["function"].pop("name")),
        ("responses", lambda d: d.pop("strict")),  # required by FunctionToolParam
        ("responses", lambda d: d.update(function={})),
        ("responses", lambda d: d.update(type="tool")),
        ("anthropic", lambda d: d.update(parameters=d.pop("input_schema"))),
        ("anthropic", lambda d: d.update(name=None)),
        ("anthropic", lambda d: d.update(cache_control={"type": "ephemeral", "when": 1})),
    ],
)
def test_the_sdk_check_rejects_what_the_sdk_types_reject(fmt: str, change: Any) -> None:
    definition = SPECS["read_artifact"].definition(fmt)  # type: ignore[arg-type]
    assert_sdk_shape(definition, SDK_TOOL_TYPES[fmt])
    change(definition)
    with pytest.raises((AssertionError, ValidationError)):
        assert_sdk_shape(definition, SDK_TOOL_TYPES[fmt])


Recording = tuple[Any, Toolset, list[dict[str, Any]]]


@pytest.fixture
def recording(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recording]:
    """A task with its tools registered whose exec records how sandbox_exec called it (a
    stand-in: no Docker here): (task, toolset, calls)."""
    harness.backend.languages = LANGS
    calls: list[dict[str, Any]] = []

    def exec_(
        lang: str, code: str, timeout: float = -1, artifact: str | None = None, **_: bool
    ) -> Any:
        calls.append({"lang": lang, "code": code, "timeout": timeout, "artifact": artifact})
        return ExecResult(0, "42\n", "", False, None, False, False)

    with harness.task("nulls") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        monkeypatch.setattr(task, "exec", exec_)
        yield task, toolset, calls


# Calls that together leave out every optional argument of every tool at least once.
CALLS: dict[str, list[dict[str, Any]]] = {
    "sandbox_exec": [
        {"lang": "sql", "code": 'SELECT count(*) FROM "c1"'},
        {"lang": "jq", "code": "length", "timeout": 5},
        {"lang": "jq", "code": "length", "artifact": "c1"},
    ],
    "read_artifact": [
        {"artifact_id": "c1"},
        {"path": "c1.txt"},
        {"artifact_id": "c1", "cursor": "CURSOR"},
        {"path": "c1.txt", "cursor": "CURSOR"},
    ],
    "list_artifacts": [{}],
    "search_artifacts": [
        {"query": "line"},
        {"query": "line", "top_k": 3},
        {"query": "line", "artifact": "c1"},
    ],
}


def test_null_means_not_given_for_every_optional_argument(recording: Recording) -> None:
    task, toolset, calls = recording
    offload(task, "c1", big_text())
    cursor = first_cursor(toolset, "c1")
    assert set(CALLS) == set(toolset.names)
    for name, given in CALLS.items():
        optional = nullable(SPECS[name])
        left_out = set().union(*(optional - set(args) for args in given))
        assert left_out == optional, f"{name}: no call leaves out {optional - left_out}"
        for args in given:
            args = {k: cursor if v == "CURSOR" else v for k, v in args.items()}
            # As strict mode sends them: every argument, null for the ones not given.
            nulls = {**args, **dict.fromkeys(optional - set(args))}
            absent, null = toolset.call(name, args), toolset.call(name, nulls)
            assert not absent.is_error and not null.is_error, (args, null.text)
            if name == "read_artifact":  # a next_cursor's expiry second may tick
                assert without_cursor(null.text) == without_cursor(absent.text)
            else:
                assert null == absent
    # sandbox_exec ran with the same arguments both ways, defaults where none was given.
    assert calls[0] == calls[1] == {
        "lang": "sql", "code": 'SELECT count(*) FROM "c1"', "timeout": DEFAULT_TIMEOUT,
        "artifact": None,
    }  # fmt: skip
    assert calls[2] == calls[3] and calls[2]["timeout"] == 5
    assert calls[4] == calls[5] and calls[4]["artifact"] == "c1"


def test_a_required_argument_given_as_null_is_missing(recording: Recording) -> None:
    _, toolset, calls = recording
    output = toolset.call(
        "sandbox_exec", {"lang": None, "code": "SELECT 1", "artifact": None, "timeout": None}
    )
    assert output.is_error and calls == []
    assert (
        json.loads(output.text)["error"]
        == "bad arguments for sandbox_exec: missing argument(s) lang"
    )


# read_artifact: paging reproduces the payload exactly, each page under the threshold


def test_json_array_pages_reproduce_every_record(harness: Harness) -> None:
    rng = random.Random(3)
    records = [
        {"id": i, "title": f"PR {i} «ünïcode» 人工智能", "body": "x " * rng.randint(5, 400)}
        for i in range(400)
    ]
    payload = json.dumps(records, indent=2, ensure_ascii=False)
    with harness.task("arr") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        admitted = offload(task, "c1", payload)
        pages = read_pages(toolset, LIMIT, path=admitted.artifact.path)  # type: ignore[union-attr]
    assert len(pages) > 3
    assert [item for page in pages for item in page["items"]] == records
    assert all(p["unit"] == "records" and p["total"] == 400 and not p["partial"] for p in pages)
    # Positions tile the array: each page starts where the previous one ended.
    assert pages[0]["position"]["start"] == 0 and pages[-1]["position"]["end"] == 400
    for before, after in zip(pages, pages[1:], strict=False):
        assert after["position"]["start"] == before["position"]["end"]
    assert pages[-1]["next_cursor"] is None and pages[-1]["has_more"] is False


def test_ndjson_pages_reproduce_every_line_as_a_record(harness: Harness) -> None:
    lines = [json.dumps({"n": i, "msg": "event " * (i % 50), "q": '"quoted"'}) for i in range(600)]
    payload = "\n".join(lines) + "\n"
    pages = offloaded_pages(harness, "nd", "events", payload)
    assert len(pages) > 3
    assert [item for page in pages for item in page["items"]] == [json.loads(x) for x in lines]
    assert {p["unit"] for p in pages} == {"records"}


def test_text_pages_reproduce_the_bytes_at_line_boundaries(harness: Harness) -> None:
    rng = random.Random(5)
    path = "C:\\tmp\\x"
    lines = [
        f'{i:05d} {rng.choice(["INFO", "WARN", "ERROR"])}\t"{path * (i % 7)}" 日志\r\n'
        for i in range(2_000)
    ]
    payload = "".join(lines) + "no newline at the end"
    pages = offloaded_pages(harness, "txt", "log", payload)
    assert len(pages) > 3
    # One tab a line: the profile takes it for TSV, whose later pages repeat its header.
    assert all(p["header_lines"] == 1 for p in pages[1:])
    assert joined_text(pages).encode() == payload.encode()
    assert {p["unit"] for p in pages} == {"lines"}
    assert all(not p["partial"] for p in pages)
    # Whole lines: every page but the last ends at a line break.
    assert all(p["text"].endswith("\n") for p in pages[:-1])


def test_a_two_megabyte_one_line_json_object_is_paged_by_character_slices(home: Path) -> None:
    rng = random.Random(7)
    value = {
        f"key{i}": {"a": rng.randint(0, 99), "s": '"q" \\ ü', "l": [1, 2.5, None]}
        for i in range(45_000)
    }
    payload = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert len(payload.encode()) > 2_000_000 and "\n" not in payload
    # The default threshold, as a model would meet it: few pages of large slices.
    with open_harness(home, per_call=6_000) as harness:
        pages = offloaded_pages(harness, "big", "obj", payload, limit=6_000)
    assert len(pages) > 10
    assert "".join(p["text"] for p in pages).encode() == payload.encode()
    assert all(p["partial"] for p in pages) and {p["unit"] for p in pages} == {"lines"}
    assert all(p["total"] == 1 for p in pages)
    middle = pages[1]["position"]
    assert middle["start"] == 0 and middle["start_offset"] > 0
    assert middle["end_offset"] == pages[2]["position"]["start_offset"]
    assert pages[-1]["position"]["end"] == 1


def test_a_single_huge_line_and_a_huge_record_are_paged(harness: Harness) -> None:
    line = "".join(random.Random(9).choice('ab "\\\t\x01人') for _ in range(60_000))
    records = [{"small": 1}, {"huge": line}, {"small": 2}]
    with harness.task("huge") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        offload(task, "line", line)
        offload(task, "rec", json.dumps(records))
        line_pages = read_pages(toolset, LIMIT, artifact_id="line")
        record_pages = read_pages(toolset, LIMIT, artifact_id="rec")
    assert len(line_pages) > 3 and all(p["partial"] for p in line_pages)
    assert "".join(p["text"] for p in line_pages) == line
    # The huge record comes as slices of its JSON text; the records around it whole.
    assert record_pages[0]["items"] == [{"small": 1}]
    slices = [p for p in record_pages if p["partial"]]
    assert len(slices) > 3
    assert json.loads("".join(p["text"] for p in slices)) == {"huge": line}
    assert record_pages[-1]["items"] == [{"small": 2}]


def test_binary_pages_are_base64_and_reproduce_the_bytes(harness: Harness) -> None:
    payload = b"\x89PNG\r\n\x1a\n" + random.Random(11).randbytes(40_000)
    with harness.task("bin") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        admitted = offload(task, "img", payload)
        assert admitted.reason == "binary"
        pages = read_pages(toolset, LIMIT, artifact_id="img")
    assert len(pages) > 3
    assert all(p["encoding"] == "base64" and p["unit"] == "bytes" for p in pages)
    assert b"".join(base64.b64decode(p["text"]) for p in pages) == payload
    assert pages[-1]["position"]["end"] == pages[-1]["total"] == len(payload)


def test_a_small_artifact_is_one_page(harness: Harness) -> None:
    with harness.task("one") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        admitted = task.offload(ToolResult("c1", "t", '[{"a": 1}, {"a": 2}]'))
        pages = read_pages(toolset, LIMIT, path=admitted.artifact.path)  # type: ignore[union-attr]
    assert pages == [
        {
            "artifact_id": "c1",
            "path": admitted.artifact.path,  # type: ignore[union-attr]
            "items": [{"a": 1}, {"a": 2}],
            "unit": "records",
            "position": {"start": 0, "end": 2},
            "total": 2,
            "returned": 2,
            "partial": False,
            "has_more": False,
            "next_cursor": None,
        }
    ]


def test_reads_are_logged_as_read_artifact(harness: Harness) -> None:
    with harness.task("log") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        offload(task, "c1", "line\n" * 5_000)
        toolset.call("read_artifact", {"artifact_id": "c1"})
    actors = [(e.action, e.actor) for e in harness.catalog.audit("log")]
    assert ("read", "read_artifact") in actors


# Cursors: tampered, expired, foreign, another home's


def first_cursor(toolset: Toolset, ref: str) -> str:
    output = toolset.call("read_artifact", {"artifact_id": ref})
    assert not output.is_error, output.text
    cursor = json.loads(output.text)["next_cursor"]
    assert isinstance(cursor, str)
    return cursor


def error_of(toolset: Toolset, args: dict[str, Any]) -> str:
    output = toolset.call("read_artifact", args)
    assert output.is_error, output.text
    assert not output.offloadable
    body = json.loads(output.text)
    assert set(body) == {"error"}
    message = body["error"]
    assert isinstance(message, str) and "\n" not in message
    return message


def big_text(seed: int = 0) -> str:
    return "".join(f"{seed} line {i} " + "word " * 20 + "\n" for i in range(3_000))


def test_a_cursor_continues_where_the_page_ended(harness: Harness) -> None:
    with harness.task("cur") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        offload(task, "c1", big_text())
        first = json.loads(toolset.call("read_artifact", {"artifact_id": "c1"}).text)
        second = json.loads(
            toolset.call("read_artifact", {"path": "c1.txt", "cursor": first["next_cursor"]}).text
        )
    assert second["position"]["start"] == first["position"]["end"]
    assert big_text().startswith(first["text"] + second["text"])


def test_pages_read_in_one_step_are_held_to_the_aggregate_and_a_withheld_one_reads_again(
    home: Path,
) -> None:
    records = [{"id": i, "body": "word " * 40} for i in range(2_000)]
    with open_harness(home, per_call=6_000) as harness, harness.task("many") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        offload(task, "c1", json.dumps(records))
        calls: list[dict[str, Any]] = [{"artifact_id": "c1"}]
        for _ in range(2):
            page = json.loads(toolset.call("read_artifact", calls[-1]).text)
            calls.append({"artifact_id": "c1", "cursor": page["next_cursor"]})

        def step(arguments: list[dict[str, Any]]) -> list[Admitted]:
            outputs = [toolset.call("read_artifact", args) for args in arguments]
            return task.admit(
                [
                    ToolResult(f"r{i}", "read_artifact", out.text, offloadable=out.offloadable)
                    for i, out in enumerate(outputs)
                ]
            )

        together = step(calls)
        assert sum(item.inline_tokens for item in together) <= 10_000
        withheld = [i for i, item in enumerate(together) if item.reason == "withheld"]
        assert withheld and not any(item.offloaded for item in together)
        for i in withheld:
            [again] = step([calls[i]])  # alone, in a later step: the same page, whole
            assert again.reason is None
            # The same page; its next_cursor may differ only in its expiry second.
            assert without_cursor(again.text) == without_cursor(
                toolset.call("read_artifact", calls[i]).text
            )


def without_cursor(page_text: str) -> dict[str, Any]:
    page: dict[str, Any] = json.loads(page_text)
    assert page.pop("next_cursor")
    return page


def test_a_tampered_cursor_is_refused(harness: Harness) -> None:
    with harness.task("cur") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        offload(task, "c1", big_text())
        cursor = first_cursor(toolset, "c1")
        body, tag = cursor.split(".")
        i = len(body) // 2
        flipped = body[:i] + ("A" if body[i] != "A" else "B") + body[i + 1 :]
        message = error_of(toolset, {"artifact_id": "c1", "cursor": f"{flipped}.{tag}"})
        assert "tampered" in message and "without a cursor" in message
        i = len(tag) // 2
        bad_tag = tag[:i] + ("A" if tag[i] != "A" else "B") + tag[i + 1 :]
        assert "tampered" in error_of(toolset, {"artifact_id": "c1", "cursor": f"{body}.{bad_tag}"})
        assert "malformed" in error_of(toolset, {"artifact_id": "c1", "cursor": "not-a-cursor"})
        assert "malformed" in error_of(toolset, {"artifact_id": "c1", "cursor": "a.b.c"})


def test_an_expired_cursor_is_refused(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    import spillbox.paging

    with harness.task("cur") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        offload(task, "c1", big_text())
        cursor = first_cursor(toolset, "c1")
        real = spillbox.paging.time.time
        later = types.SimpleNamespace(time=lambda: real() + CURSOR_TTL_SECONDS + 5)
        monkeypatch.setattr(spillbox.paging, "time", later)
        assert "expired" in error_of(toolset, {"artifact_id": "c1", "cursor": cursor})
        monkeypatch.undo()
        # Still good before it expires.
        output = toolset.call("read_artifact", {"artifact_id": "c1", "cursor": cursor})
        assert not output.is_error


def test_a_cursor_signed_with_no_lifetime_is_refused(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spillbox.tools

    monkeypatch.setattr(spillbox.tools, "CURSOR_TTL_SECONDS", -1.0)
    with harness.task("cur") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        offload(task, "c1", big_text())
        cursor = first_cursor(toolset, "c1")
        assert "expired" in error_of(toolset, {"artifact_id": "c1", "cursor": cursor})


def test_a_cursor_of_another_task_or_artifact_is_refused(harness: Harness) -> None:
    payload = big_text()
    with harness.task("a") as a, harness.task("b") as b:
        tools_a, tools_b = Toolset(a), Toolset(b)
        offload(a, "c1", payload)
        offload(a, "c2", big_text(seed=2))
        offload(b, "c1", payload)  # same id, same bytes: only the task differs
        cursor = first_cursor(tools_a, "c1")
        message = error_of(tools_b, {"artifact_id": "c1", "cursor": cursor})
        assert "another task" in message
        message = error_of(tools_a, {"artifact_id": "c2", "cursor": cursor})
        assert "another artifact" in message


def test_a_cursor_of_another_home_is_refused(tmp_path: Path) -> None:
    payload = big_text()
    with open_harness(tmp_path / "one") as one, open_harness(tmp_path / "two") as two:
        with one.task("t") as t1, two.task("t") as t2:
            tools1, tools2 = Toolset(t1), Toolset(t2)
            offload(t1, "c1", payload)
            offload(t2, "c1", payload)  # same task id, artifact and bytes: only the secret
            cursor = first_cursor(tools1, "c1")
            message = error_of(tools2, {"artifact_id": "c1", "cursor": cursor})
            assert "another spillbox home" in message
            # The other home's own cursor works there.
            output = tools2.call(
                "read_artifact", {"artifact_id": "c1", "cursor": first_cursor(tools2, "c1")}
            )
            assert not output.is_error


def test_the_secret_is_private_and_kept(home: Path) -> None:
    with open_harness(home) as harness, harness.task("t") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        offload(task, "c1", big_text())
        cursor = first_cursor(toolset, "c1")
    secret = home / SECRET_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert len(secret.read_bytes()) == 32
    # A restarted harness reads the same secret: its cursors stay valid.
    with open_harness(home) as harness, harness.task("t") as task:
        output = Toolset(task).call("read_artifact", {"artifact_id": "c1", "cursor": cursor})
        assert not output.is_error, output.text


# Errors the model sees, and list_artifacts


def test_a_deleted_artifact_says_when_and_by_which_policy(harness: Harness) -> None:
    with harness.task("del") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        admitted = offload(task, "c1", big_text())
        cursor = first_cursor(toolset, "c1")
        task.delete("c1")
        for args in (
            {"artifact_id": "c1"},
            {"path": admitted.artifact.path},  # type: ignore[union-attr]
            {"artifact_id": "c1", "cursor": cursor},
        ):
            message = error_of(toolset, args)
            assert re.search(r"deleted at \d{4}-\d\d-\d\dT[\d:]+\+00:00 by policy manual", message)
        assert json.loads(toolset.call("list_artifacts", {}).text) == []


def test_bad_calls_come_back_as_errors(harness: Harness) -> None:
    with harness.task("bad") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        offload(task, "c1", big_text())
        assert "no artifact 'nope'" in error_of(toolset, {"artifact_id": "nope"})
        assert "give path" in error_of(toolset, {})
        assert "unknown argument(s) offset" in error_of(toolset, {"path": "c1", "offset": 3})
        for name, args in (
            ("sandbox_exec", {"lang": "sql", "code": "SELECT 1"}),  # not registered: no sandbox
            ("rm_rf", {}),
        ):
            output = toolset.call(name, args)
            assert output.is_error
            message = json.loads(output.text)["error"]
            assert f"unknown tool {name!r}" in message and "read_artifact" in message
        for raw in ("{not json", "[1, 2]", "notjson", '"c1"'):
            output = toolset.call("read_artifact", raw)
            message = json.loads(output.text)["error"]
            assert output.is_error and message.startswith(
                "bad arguments for read_artifact: the arguments must be a JSON object, "
                'for example {"artifact_id": "c1"}'
            ), message
        # Arguments as the JSON string a model sends work too.
        assert not toolset.call("read_artifact", '{"artifact_id": "c1"}').is_error


def test_list_artifacts_lists_each_live_artifact(harness: Harness) -> None:
    with harness.task("ls") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        assert json.loads(toolset.call("list_artifacts", {}).text) == []
        first = offload(task, "c1", big_text(), tool="logs")
        offload(task, "c2", b"\x00\xff" * 10, tool="blob")
        output = toolset.call("list_artifacts", {})
    assert not output.is_error
    rows = json.loads(output.text)
    assert [(r["artifact_id"], r["tool"], r["call_id"]) for r in rows] == [
        ("c1", "logs", "c1"),
        ("c2", "blob", "c2"),
    ]
    assert rows[0]["path"] == first.artifact.path  # type: ignore[union-attr]
    assert rows[0]["bytes"] == len(big_text().encode()) and rows[0]["tokens"] > LIMIT
    assert rows[1]["bytes"] == 20 and rows[1]["tokens"] is None


# Notices name exactly the registered tools


def hint_lines(text: str) -> list[str]:
    fields = parse_notice(text)
    assert fields is not None, text
    return fields["hint"].splitlines() if "hint" in fields else []


def test_notice_hints_are_calls_of_the_registered_tools(harness: Harness) -> None:
    payloads: dict[str, str | bytes] = {
        "arr": json.dumps([{"id": i, "body": "b" * 200} for i in range(300)]),
        "nd": "\n".join(json.dumps({"k": i, "v": "y" * 200}) for i in range(300)),
        "tab": "a,b\n" + "\n".join(f"{i},{'z' * 100}" for i in range(800)),
        "log": "\n".join(f"line {i} ok" for i in range(6000)),
        "bin": bytes(range(256)) * 10,
    }
    with harness.task("before") as task:
        # No tools registered, and sandbox="none" has no code mode: the one route that
        # works there, the CLI on the same store, rather than a tool that is not offered.
        for call_id, content in payloads.items():
            [line] = hint_lines(offload(task, call_id, content).text)
            assert line == (
                "cli: spillbox call --sandbox none --task 'before' read_artifact "
                f'\'{{"artifact_id": "{call_id}"}}\''
            )
    with harness.task("after") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        for call_id, content in payloads.items():
            notice = offload(task, call_id, content).text
            assert "sandbox_exec" not in notice and "sql:" not in notice
            [line] = hint_lines(notice)
            name, _, raw = line.partition(" ")
            assert name == "read_artifact" and name in toolset.names
            args = json.loads(raw)
            assert args == {"path": parse_notice(notice)["path"]}  # type: ignore[index]
            output = toolset.call(name, args)
            assert not output.is_error, output.text
            assert json.loads(output.text)["artifact_id"] == call_id


# read_artifact over records wrapped in an object


def test_wrapped_records_are_read_as_records_after_the_envelope(harness: Harness) -> None:
    value = slack_history(120)
    with harness.task("slack") as task:
        admitted = offload(task, "history", json.dumps(value, indent=2))
        fields = parse_notice(admitted.text)
        assert fields is not None and fields["records"] == "messages, 120 objects"
        pages = read_pages(Toolset(task), LIMIT, artifact_id="history")
    envelope, *records = pages
    assert envelope["unit"] == "envelope" and envelope["records"] == "messages"
    assert envelope["envelope"]["response_metadata"] == value["response_metadata"]
    assert envelope["envelope"]["messages"].startswith("[120 records at messages")
    assert envelope["total"] == 120 and envelope["has_more"]
    assert len(records) > 2 and all(p["unit"] == "records" for p in records)
    assert all(p["records"] == "messages" and not p["partial"] for p in records)
    assert [item for p in records for item in p["items"]] == value["messages"]
    assert records[-1]["position"]["end"] == 120


def test_read_artifact_pages_the_array_its_records_argument_names(harness: Harness) -> None:
    value = github_search(60)
    value["warnings"] = [{"code": i} for i in range(3)]
    with harness.task("named") as task:
        offload(task, "search", json.dumps(value))
        toolset = Toolset(task)
        pages = read_pages(toolset, LIMIT, artifact_id="search", records="$.warnings")
        assert {p["records"] for p in pages} == {"warnings"}
        # The envelope holds the 60 items now: too big for a page, it comes in slices.
        *envelope, last = pages
        assert len(envelope) > 1 and all(p["partial"] for p in envelope)
        assert json.loads("".join(p["text"] for p in envelope))["items"] == value["items"]
        assert last["unit"] == "records" and last["items"] == value["warnings"]
        first = json.loads(toolset.call("read_artifact", {"artifact_id": "search"}).text)
        assert first["records"] == "items"
        # A cursor walks the path it was made for: another one is refused, null follows it.
        wrong = toolset.call(
            "read_artifact",
            {"artifact_id": "search", "cursor": first["next_cursor"], "records": "warnings"},
        )
        assert wrong.is_error and "another records path" in wrong.text
        same = toolset.call(
            "read_artifact",
            {"artifact_id": "search", "cursor": first["next_cursor"], "records": None},
        )
        assert json.loads(same.text)["items"][0] == value["items"][0]
        for bad, said in [
            ("total_count", "its arrays are items, warnings"),
            ("items[0]", "not a path"),
        ]:
            output = toolset.call("read_artifact", {"artifact_id": "search", "records": bad})
            assert output.is_error and said in output.text, output.text


def test_a_records_argument_on_a_bare_array_is_refused_clearly(harness: Harness) -> None:
    with harness.task("bare") as task:
        offload(task, "arr", json.dumps([{"id": i, "body": "x" * 40} for i in range(300)]))
        output = Toolset(task).call("read_artifact", {"artifact_id": "arr", "records": "items"})
    assert output.is_error and "leave records null" in output.text
