"""Offloaded payloads as MCP resources: an offloaded result carries a resource_link to its
payload, and resources/read serves it a page at a time, as read_artifact pages it.

    link = resource_link("t1", artifact)      # uri spillbox://t1/git_log_1
    parse_uri("spillbox://t1/git_log_1?cursor=c")   # ("t1", "git_log_1", {"cursor": "c"})
    parse_uri("spillbox://t1/issues?start=40&limit=5&fields=id&fields=title")

A read returns one page (under the per-call limit, like any read_artifact page) as
application/json: read_artifact's result, with `next_uri`, the URI of the next page (the
same URI with the page's cursor, which keeps what the query asked; null on the last page).
The query steers the read as read_artifact's arguments do: cursor, start, limit, records,
and fields (one key a parameter, repeated for more).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import mcp_types as types

from spillbox.types import Artifact, ArtifactRow, ShapeKind

SCHEME = "spillbox"
MIME_TYPES: dict[ShapeKind, str] = {
    "json_array": "application/json",
    "json_object": "application/json",
    "json_scalar": "application/json",
    "ndjson": "application/x-ndjson",
    "csv": "text/csv",
    "text": "text/plain",
    "binary": "application/octet-stream",
}
"""The mimeType a link states for a payload of each shape kind."""


def artifact_uri(task_id: str, artifact_id: str, cursor: str | None = None) -> str:
    uri = f"{SCHEME}://{quote(task_id, safe='')}/{quote(artifact_id, safe='')}"
    return f"{uri}?{urlencode({'cursor': cursor})}" if cursor else uri


READ_QUERY = ("cursor", "start", "limit", "records", "fields")
"""The query parameters a resource read takes: read_artifact's arguments of those names."""


def parse_uri(uri: str) -> tuple[str, str, dict[str, Any]] | None:
    """(task id, artifact id, read_artifact's arguments from the query) of a spillbox URI;
    None for any other URI. A number stays text where it is not one, for read_artifact
    to refuse in its own words."""
    parts = urlsplit(uri)
    if parts.scheme != SCHEME:
        return None
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - set(READ_QUERY))
    if unknown:
        raise ValueError(
            f"unknown query parameter(s) {', '.join(unknown)}: a read takes {', '.join(READ_QUERY)}"
        )
    arguments: dict[str, Any] = dict.fromkeys(READ_QUERY)
    for name, values in query.items():
        if name == "fields":
            arguments[name] = values
            continue
        if len(values) > 1:
            raise ValueError(f"{name} is given {len(values)} times: give it once")
        value = values[0]
        arguments[name] = int(value) if name in ("start", "limit") and value.isdigit() else value
    return unquote(parts.netloc), unquote(parts.path.lstrip("/")), arguments


def resource_link(task_id: str, artifact: Artifact) -> types.ResourceLink:
    return types.ResourceLink(
        uri=artifact_uri(task_id, artifact.id),
        name=artifact.name,
        description=f"The stored result of {artifact.tool} ({artifact.call_id}); "
        "resources/read returns it a page at a time (the query steers it: ?start=40&limit=5, "
        "&fields=id&fields=title for some keys of each record).",
        mime_type=MIME_TYPES[artifact.shape.kind],
        size=artifact.bytes,
    )


def resource(row: ArtifactRow) -> types.Resource:
    """An artifact as resources/list shows it."""
    return types.Resource(
        uri=artifact_uri(row.task_id, row.artifact_id),
        name=row.name,
        description=f"The stored result of {row.tool} ({row.call_id}).",
        mime_type=MIME_TYPES[row.kind] if row.kind in MIME_TYPES else None,
        size=row.bytes,
    )
