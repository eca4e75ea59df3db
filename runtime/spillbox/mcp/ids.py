"""A request whose id JSON-RPC does not allow, refused where the SDK would drop it.

JSON-RPC and MCP give a request a string or an integer id. The SDK's message union takes
a request with any other id (an object, an array, a float, a boolean, null) for a
notification: nothing runs and nothing ever answers, so its client waits forever. Both
client-facing transports that see the raw message refuse it instead, with a JSON-RPC
Invalid Request (id null): stdio (transport.py) and 2025-era streamable HTTP
(deferred.py); the SDK's 2026-07-28 path refuses it itself.
"""

from __future__ import annotations

import json
import re

import mcp_types as types

REFUSAL = "Invalid Request: a request's id must be a string or an integer"
_SUSPECT = re.compile(rb'"id"\s*:\s*(?:[^"\s\d-]|-?\d+[.eE])')
"""An "id" key whose value starts as no string or integer does (at any depth: a
tool's own arguments may have one)."""


def refused(body: object) -> bool:
    """Whether body is a request but for its id."""
    if not (isinstance(body, dict) and "method" in body and "id" in body):
        return False
    given = body["id"]
    return isinstance(given, bool) or not isinstance(given, str | int)


def refused_line(line: bytes) -> bool:
    """Whether one line of JSON is a request but for its id. Only a line with a suspect
    "id" key is parsed here; every other line costs one scan."""
    if _SUSPECT.search(line) is None:
        return False
    try:
        return refused(json.loads(line))
    except (ValueError, RecursionError):
        return False  # not JSON: the SDK answers it with its parse error


def refusal() -> types.JSONRPCError:
    """The answer to such a request: it has no id to answer by."""
    error = types.ErrorData(code=types.INVALID_REQUEST, message=REFUSAL)
    return types.JSONRPCError(jsonrpc="2.0", id=None, error=error)
