"""A Messages API on 127.0.0.1 for driving the `claude` CLI offline (ANTHROPIC_BASE_URL):
each POST /v1/messages gets the next scripted turn, streamed as server-sent events the way
the API streams them; every request is recorded, so a test asserts on what the model saw.

    fake = FakeMessagesAPI([lambda body: [tool_use("c1", "Bash", {"command": "ls"})],
                            lambda body: [text("done")]])
    env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "sk-fake"}
    ...
    fake.requests[1]["messages"][-1]   # the tool results the model got
    fake.arrived[1] - fake.answered[0] # the CLI's time between the two: tools and hooks
    fake.close()

Standard library only: it is for tests and examples, never for a real model.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Turn = Callable[[dict[str, Any]], list[dict[str, Any]]]
"""A scripted model turn: the request's body -> the assistant's content blocks."""


class FakeMessagesAPI:
    """A Messages API on 127.0.0.1 that answers each POST /v1/messages with the next
    scripted turn, streamed as server-sent events, and records every request it gets."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = list(turns)
        self.requests: list[dict[str, Any]] = []
        self.others: list[str] = []
        """Any other request (the CLI must send none)."""
        self.arrived: list[float] = []
        """When each request came (time.perf_counter())."""
        self.answered: list[float] = []
        """When each answer's last event was sent."""
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.others.append(f"GET {self.path}")
                self.send_error(404)

            def do_HEAD(self) -> None:
                fake.others.append(f"HEAD {self.path}")
                self.send_error(404)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.path.split("?")[0] != "/v1/messages":
                    fake.others.append(f"POST {self.path}")
                    self.send_error(404)
                    return
                fake.arrived.append(time.perf_counter())
                fake.requests.append(body)
                blocks = fake.turns.pop(0)(body) if fake.turns else [text("(no turn left)")]
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for event in _stream(len(fake.requests), body["model"], blocks):
                    self.wfile.write(
                        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                    )
                self.wfile.flush()
                fake.answered.append(time.perf_counter())

        return Handler


def _stream(n: int, model: str, blocks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One assistant message as the Messages API streams it."""
    usage = {"input_tokens": 1, "output_tokens": 1}
    message: dict[str, Any] = {
        **{"id": f"msg_{n}", "type": "message", "role": "assistant", "model": model},
        **{"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage},
    }
    yield {"type": "message_start", "message": message}
    for i, block in enumerate(blocks):
        start: dict[str, Any]
        delta: dict[str, Any]
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield {"type": "content_block_start", "index": i, "content_block": start}
        yield {"type": "content_block_delta", "index": i, "delta": delta}
        yield {"type": "content_block_stop", "index": i}
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    yield {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
           "usage": {"output_tokens": 1}}  # fmt: skip
    yield {"type": "message_stop"}


def text(value: str) -> dict[str, Any]:
    """A text block of a scripted turn."""
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool call of a scripted turn."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
