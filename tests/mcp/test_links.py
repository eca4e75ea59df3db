"""The MIME type a resource link and a listed resource state, for every shape kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spillbox import Harness, ToolResult
from spillbox.mcp.links import resource, resource_link

PAYLOADS = {
    "array": (json.dumps([{"id": i, "body": "x" * 40} for i in range(2000)]), "application/json"),
    "object": (json.dumps({"items": [{"id": i} for i in range(9000)]}), "application/json"),
    "ndjson": ("".join(json.dumps({"id": i}) + "\n" for i in range(9000)), "application/x-ndjson"),
    "csv": ("id,body\n" + "".join(f"{i},row {i}\n" for i in range(9000)), "text/csv"),
    "text": ("".join(f"line {i} of a log\n" for i in range(9000)), "text/plain"),
    "binary": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 400, "application/octet-stream"),
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_a_link_states_the_payloads_mime_type(home: Path, name: str) -> None:
    content, mime = PAYLOADS[name]
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness, harness.task("t") as task:
        [admitted] = task.admit([ToolResult(call_id=name, tool="t", content=content)])
        assert admitted.artifact is not None, admitted.text
        assert resource_link("t", admitted.artifact).mime_type == mime
        [row] = harness.catalog.artifacts("t")
        assert resource(row).mime_type == mime
