"""Fallback compaction: make room in a request without losing anything.

When a budget's compactable routes (history, tool results, retrieved) are over their soft
limits, Fallback runs these stages in order, each only while the budget is still over:

  a. tool results: all but the last few move into the task's sandbox and become notices
     (adapters.compact_history); read_artifact opens them again.
  b. archive: the oldest turns are appended to the task's history (spillbox.history: one
     NDJSON artifact per task, one message a line, searchable with SQL, grep and
     search_artifacts, under the task's retention), and one message in their place says
     which lines of the history they are and how to open them. The system prompt (every
     system or developer message) and the first user message (the task) always stay.
  c. summary: only with a summariser (a callable); the turns it summarises are archived
     first, as in b, and the summary stands beside the archive's notice.
  d. backstop: the last min_recent messages always stay as they are; if the budget is
     still over a hard limit, Budget.check raises BudgetExceeded.

    budget.check(request, provider="chat_completions", compactor=Fallback(task))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spillbox.adapters import compact_history
from spillbox.budget import BudgetReport, Provider, Stage, message_list_key
from spillbox.errors import ConfigError
from spillbox.history import HISTORY_REF, HISTORY_TOOL, History

if TYPE_CHECKING:
    from spillbox.protocols import TaskHandle

DEFAULT_KEEP_TOOL_RESULTS = 3
"""Stage a leaves this many of the latest tool results inline."""
DEFAULT_MIN_RECENT = 4
"""The backstop: this many of the latest messages are never archived or summarised."""
DEFAULT_KEEP_RECENT = 12
"""With a summariser, stage b archives down to this many latest messages; stage c
summarises further, down to min_recent."""
ARCHIVE_TOOL = HISTORY_TOOL
"""The tool name the task's history of archived turns is stored under."""
ARCHIVE_MARK = "[spillbox: earlier turns archived]"
"""The first words of the message that stands for archived turns."""
DEFAULT_TARGET_SHARE = 0.6
"""Archiving frees room down to this share of each compactable route's hard limit, below
its soft limit: archives come in larger, rarer pieces, and each one changes the start of
the conversation (and so its prompt-cache prefix) less often."""
_NOTICE_ALLOWANCE_TOKENS = 600
"""What an archive's message is assumed to cost when choosing how many turns to archive."""

Summariser = Callable[[Sequence[Mapping[str, Any]]], str]
"""Turns (in the request's own shape) to a summary text."""
Measure = Callable[[Mapping[str, Any]], BudgetReport]


class Fallback:
    """spillbox's own reversible compaction, for models without native compaction.

    >>> compactor = Fallback(task, summariser=None, min_recent=4)  # doctest: +SKIP
    >>> report = budget.check(request, "anthropic", compactor=compactor)  # doctest: +SKIP
    >>> [stage.name for stage in report.stages]  # doctest: +SKIP
    ['tool_results', 'archive']
    """

    def __init__(
        self,
        task: TaskHandle,
        summariser: Summariser | None = None,
        *,
        keep_tool_results: int = DEFAULT_KEEP_TOOL_RESULTS,
        min_recent: int = DEFAULT_MIN_RECENT,
        keep_recent: int = DEFAULT_KEEP_RECENT,
        target_share: float = DEFAULT_TARGET_SHARE,
    ) -> None:
        for name, value in (
            ("keep_tool_results", keep_tool_results),
            ("min_recent", min_recent),
            ("keep_recent", keep_recent),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a whole number of 0 or more, got {value!r}")
        if keep_recent < min_recent:
            raise ConfigError(
                f"keep_recent ({keep_recent}) must be at least min_recent ({min_recent})"
            )
        if not 0 < target_share <= 1:
            raise ConfigError(f"target_share must be above 0 and at most 1, got {target_share!r}")
        self.target_share = target_share
        self.task = task
        self.summariser = summariser
        self.keep_tool_results = keep_tool_results
        self.min_recent = min_recent
        self.keep_recent = keep_recent if summariser is not None else min_recent
        self.history = History(task)

    def compact(
        self, request: Mapping[str, Any], provider: Provider, measure: Measure
    ) -> tuple[Mapping[str, Any], list[Stage]]:
        key = message_list_key(provider)
        if not isinstance(request.get(key), list):
            return request, []  # a Responses input given as one string: nothing to move
        stages: list[Stage] = []
        report = measure(request)
        if not report.needs_room:
            return request, stages
        messages = compact_history(self.task, request[key], keep_last=self.keep_tool_results)
        request, report, freed = _replaced(request, key, messages, report, measure)
        if freed > 0:
            stages.append(Stage("tool_results", "older tool results replaced by notices", freed))
        for name, keep, summariser in (
            ("archive", self.keep_recent, None),
            ("summary", self.min_recent, self.summariser),
        ):
            while report.needs_room and (name == "archive" or summariser is not None):
                archived = self._archive(request[key], provider, report, keep, summariser)
                if archived is None:
                    break
                request, report, freed = _replaced(request, key, archived[0], report, measure)
                stages.append(Stage(name, archived[1], freed))
                if freed <= 0:
                    break  # only an earlier notice could move: nothing more to gain
        if report.needs_room:
            stages.append(
                Stage(
                    "backstop",
                    f"the last {self.min_recent} messages, the system prompt and the task stay",
                    0,
                )
            )
        return request, stages

    def _archive(
        self,
        messages: list[dict[str, Any]],
        provider: Provider,
        report: BudgetReport,
        keep: int,
        summariser: Summariser | None,
    ) -> tuple[list[dict[str, Any]], str] | None:
        """messages with their oldest movable turns archived (enough of them, by the
        report's counts, to bring the compactable routes down to target_share of their
        limits) and what was done, or None if no turn can move."""
        start = _first_movable(messages, provider)
        cuts = [
            j
            for j in range(start + 1, len(messages) - keep + 1)
            if _starts_turn(messages, j, provider)
        ]
        if not cuts:
            return None
        tokens = [0] * len(messages)
        for index, _, count in report.parts:
            if 0 <= index < len(tokens):
                tokens[index] += count
        need = _NOTICE_ALLOWANCE_TOKENS + report.excess(self.target_share)
        cut = next((j for j in cuts if sum(tokens[start:j]) >= need), cuts[-1])
        moved = [m for m in messages[start:cut] if not _is_system(m, provider)]
        kept_system = [m for m in messages[start:cut] if _is_system(m, provider)]
        if not any(not _is_archive_notice(m) for m in moved):
            return None  # only an earlier archive's notice could move: no room to gain
        # A turn the loop already recorded (run's record_turns) is not stored twice.
        span = self.history.append(moved, skip_known=True)
        text = (
            f"{len(moved)} messages (positions {start}-{cut - 1} of the conversation) were "
            "moved to the task's history to keep the request within its token budget: lines "
            f"{span.first}-{span.last} of {HISTORY_REF!r}, which holds every archived turn of "
            "this task whole, one JSON message a line, and is only ever appended to (where "
            "spillbox's tools are offered, search_artifacts finds any turn in it). The notice "
            "below says how to open it.\n" + span.admitted.text
        )
        if summariser is not None:
            text = f"Summary of the archived turns:\n{summariser(moved)}\n\n{text}"
        notice = {"role": "user", "content": f"{ARCHIVE_MARK} {text}"}
        detail = f"{len(moved)} messages archived as lines {span.first}-{span.last}"
        detail += f" of {span.artifact_id}"
        return [*messages[:start], *kept_system, notice, *messages[cut:]], detail


def _replaced(
    request: Mapping[str, Any],
    key: str,
    messages: list[dict[str, Any]],
    before: BudgetReport,
    measure: Measure,
) -> tuple[Mapping[str, Any], BudgetReport, int]:
    """The request with its messages replaced, its report, and the tokens that freed."""
    out = {**request, key: messages}
    after = measure(out)
    return out, after, before.input_tokens - after.input_tokens


def _is_system(message: Mapping[str, Any], provider: Provider) -> bool:
    return provider != "anthropic" and message.get("role") in ("system", "developer")


def _is_archive_notice(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(ARCHIVE_MARK)


def _first_movable(messages: Sequence[Mapping[str, Any]], provider: Provider) -> int:
    """The index after the system prompt and the first user message: nothing before it
    ever moves. An earlier archive's notice after them moves into the next archive, so
    one notice leads to all (the history never fills with notices)."""
    i = 0
    while i < len(messages) and _is_system(messages[i], provider):
        i += 1
    while i < len(messages) and messages[i].get("role") != "user":
        i += 1
    return i + 1  # the first user message: the task


def _starts_turn(messages: Sequence[Mapping[str, Any]], j: int, provider: Provider) -> bool:
    """Whether the messages from j on can stand without those before j: j is not a tool
    result (its call would be archived) nor an item that needs the one before it."""
    if j >= len(messages):
        return True
    message = messages[j]
    if provider == "chat_completions":
        return message.get("role") in ("user", "assistant")
    if provider == "anthropic":
        content = message.get("content")
        return not (
            isinstance(content, list)
            and any(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
        )
    kind = message.get("type", "message")
    previous = messages[j - 1].get("type") if j > 0 else None
    return kind == "message" or (kind in ("function_call", "reasoning") and previous != "reasoning")
