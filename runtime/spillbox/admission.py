"""What a task lets in: refusals, redaction, the gate's decisions and the offloads they make.

Task.admit, Task.offload, Task.append and Task.store_file come here; the gate itself (spillbox.gate)
decides, the offload path (spillbox.offload) stores, and this module applies them to one
task under its policy and retention.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from spillbox import codemode
from spillbox.access import TaskParts
from spillbox.config import Policy
from spillbox.errors import ConfigError
from spillbox.gate import Decision, Offload, PerCallLimit, admit
from spillbox.notice import Hint
from spillbox.offload import Destination, OffloadPath, append, offload
from spillbox.redaction import Redaction, redact_payload
from spillbox.tokens import TokenCounter, total
from spillbox.tools import tool_hints
from spillbox.types import Admitted, Artifact, ArtifactRow, Reason, ToolResult


class Admission:
    """The gate in front of one task's storage, and the offloads it makes there."""

    def __init__(
        self,
        parts: TaskParts,
        policy: Policy,
        counter: TokenCounter,
        evict: Callable[[ArtifactRow], None],
    ) -> None:
        self.task_id = parts.task_id
        self.catalog = parts.catalog
        self.backend = parts.backend
        self.storage = parts.storage
        self.retention = parts.retention
        self.policy = policy
        self.counter = counter
        self.tools: frozenset[str] = frozenset()
        """spillbox's model-facing tools offered to the model: the notices' hints name them."""
        self._lock = threading.Lock()
        self._redactions: dict[int, Redaction] = {}
        """What admit redacted in the step being gated, by result identity (under _lock)."""
        self._destination = Destination(
            task_id=parts.task_id,
            storage=parts.storage,
            catalog=parts.catalog,
            policy=policy,
            retention=parts.retention,
            counter=counter,
            visible_path=parts.backend.visible_path,
            hints=self._hints,
            evict=evict,
        )

    def admit(self, results: Sequence[ToolResult], remaining: int | None) -> list[Admitted]:
        """Gate one step's results; see Task.admit."""
        refused = {i: no for i, r in enumerate(results) if (no := self.refusal(r)) is not None}
        results = [r for i, r in enumerate(results) if i not in refused]
        redacted: dict[int, Redaction] = {}
        if self.retention.redact:
            results = [_redacted(result, redacted) for result in results]
        with self._lock:
            self._redactions = redacted
            try:
                decisions = admit(results, self.policy, self.counter, self._offload, remaining)
            finally:
                self._redactions = {}
        for d in decisions:
            found = redacted.get(id(d.result))
            if d.artifact is None and found is not None and found.count:
                detail = found.audit_detail(d.result.call_id)
                self.catalog.log(self.task_id, None, "redact", d.result.tool, detail)
        # Start the sandbox only now, while the model reads this step: a container start
        # competing for the cores would slow this step's offloads several times over.
        self.backend.warm(self.storage, self.storage.take_published())
        gated = iter(_admitted(d) for d in decisions)
        return [
            next(gated) if i not in refused else refused[i]
            for i in range(len(results) + len(refused))
        ]

    def refusal(self, result: ToolResult) -> Admitted | None:
        """A one-line error in place of a result the task cannot take: over the policy's
        max_result_bytes (counted before any copy is made), or with a call id or tool name
        that no catalog can hold (a lone surrogate, a NUL). None for a result the gate can
        take."""
        why = None
        for what, ident in (("call id", result.call_id), ("tool name", result.tool)):
            bad = not_text(ident)
            if bad is not None:
                why = f"its {what} {ident!r} {bad}; call the tool again"
                break
        if why is None:
            cap, size = self.policy.max_result_bytes, result.size()
            if size <= cap:
                return None
            why = (
                f"it is {size} bytes, over the {cap}-byte cap on one result "
                "(Policy.max_result_bytes); ask the tool for less (a page, a filter, a limit)"
            )
        text = f"[spillbox] result refused, nothing was stored: {why}"
        return Admitted(
            call_id=result.call_id,
            tool=result.tool,
            text=text,
            offloaded=False,
            reason="refused",
            tokens=None,
            tokens_exact=None,
            inline_tokens=self.counter.count(text),
            artifact=None,
            is_error=True,
        )

    def offload(self, result: ToolResult, reason: Reason) -> Admitted:
        """Store one result now, whatever its size, and return its notice (compaction)."""
        return self._store_now(result, reason, offload)

    def append(self, result: ToolResult, reason: Reason) -> Admitted:
        """Append one result's payload to its call id's artifact; see Task.append."""
        return self._store_now(result, reason, append)

    def _store_now(self, result: ToolResult, reason: Reason, path: OffloadPath) -> Admitted:
        data, text = result.payload()
        tokens = None if text is None else total(self.counter, text)
        request = Offload(result, data, text, reason, tokens, PerCallLimit.of(self.policy))
        with self._lock:
            artifact, notice, notice_tokens = path(
                self._destination, request, self._redactions.get(id(result))
            )
        whole = artifact.tokens  # an append's: the whole artifact's, not the new bytes'
        return Admitted(
            call_id=result.call_id,
            tool=result.tool,
            text=notice,
            offloaded=True,
            reason=reason,
            tokens=whole.tokens if whole else None,
            tokens_exact=whole.exact if whole else None,
            inline_tokens=notice_tokens,
            artifact=artifact,
            is_error=result.is_error,
        )

    def store_file(self, name: str, data: bytes, tool: str) -> Artifact:
        """Store a file a script left in /sandbox/outputs; see Task.store_file."""
        result = ToolResult(call_id=name, tool=tool, content=data, file_name=name)
        refusal = self.refusal(result)
        if refusal is not None:
            raise ConfigError(refusal.text.removeprefix("[spillbox] "))
        payload, text = result.payload()
        request = Offload(result, payload, text, "output", None, PerCallLimit.of(self.policy))
        with self._lock:
            artifact, _, _ = self._offload(request)
        return artifact

    def redacted(self, text: str, source: str) -> str:
        """text with its secrets replaced under a redacting policy; see Task.redacted."""
        if not self.retention.redact:
            return text
        redaction = redact_payload(text.encode("utf-8", "surrogatepass"))
        if not redaction.count:
            return text
        self.catalog.log(self.task_id, None, "redact", source, redaction.audit_detail())
        return redaction.data.decode("utf-8", "surrogatepass")

    def _offload(self, request: Offload) -> tuple[Artifact, str, int]:
        return offload(self._destination, request, self._redactions.get(id(request.result)))

    def _hints(self, artifact: Artifact) -> list[Hint]:
        hints = codemode.hints(artifact, self.backend.languages)
        return tool_hints(hints, artifact, self.tools)


def _admitted(d: Decision) -> Admitted:
    """What the gate decided for one result, as the caller gets it."""
    return Admitted(
        call_id=d.result.call_id,
        tool=d.result.tool,
        text=d.text,
        offloaded=d.artifact is not None,
        reason=d.reason,
        tokens=d.tokens.tokens if d.tokens else None,
        tokens_exact=d.tokens.exact if d.tokens else None,
        inline_tokens=d.inline_tokens,
        artifact=d.artifact,
        is_error=d.result.is_error,
    )


def _redacted(result: ToolResult, redacted: dict[int, Redaction]) -> ToolResult:
    """The result with its secrets replaced (as it was, if it is not text or has none);
    what was replaced is kept in `redacted`, by the returned result's identity."""
    data, text = result.payload()
    if text is None:
        return result
    redaction = redact_payload(data)
    if redaction.count:
        result = replace(result, content=redaction.data.decode("utf-8"))
    redacted[id(result)] = redaction
    return result


def not_text(ident: str) -> str | None:
    """What makes an id text no catalog can hold (a lone surrogate, or a NUL, which Postgres
    refuses), and where; None if it is valid text."""
    try:
        ident.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds a lone surrogate at position {e.start} (not valid Unicode)"
    at = ident.find("\0")
    return None if at < 0 else f"holds a NUL character at position {at}"
