"""spillbox: a sandbox offload runtime for agent loops.

Every tool result passes the gate; results too large for the model's context are stored
byte for byte in the task's sandbox, and the model gets a compact notice instead.

Names are imported when first used (PEP 562), so `import spillbox` and the command line do
not pay for the catalog, Docker, DuckDB or the SDKs until a name that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spillbox.adapters import (
        add_tools,
        compact_history,
        gate_anthropic,
        gate_chat_completions,
        gate_responses,
    )
    from spillbox.budget import Budget, BudgetExceeded, BudgetReport, Route
    from spillbox.compaction import Fallback
    from spillbox.config import Policy, Settings
    from spillbox.errors import (
        ConfigError,
        ExecError,
        HostLostError,
        RetentionError,
        SandboxError,
        SpillboxError,
        StorageError,
    )
    from spillbox.harness import Harness, Task
    from spillbox.langs import Lang
    from spillbox.loop import LoopResult, ScriptedModel, ToolCall, Turn, UserTool
    from spillbox.loop import run as run_loop
    from spillbox.native import Capability, Native, plan_native
    from spillbox.notice import parse_notice
    from spillbox.retention import Retention
    from spillbox.tokens import TiktokenCounter, TokenCounter, counter_for_model
    from spillbox.tools import ToolOutput, Toolset, ToolSpec
    from spillbox.types import Admitted, Artifact, ExecResult, Reason, TokenCount, ToolResult

_EXPORTS: dict[str, tuple[str, str]] = {
    "add_tools": ("spillbox.adapters", "add_tools"),
    "compact_history": ("spillbox.adapters", "compact_history"),
    "gate_anthropic": ("spillbox.adapters", "gate_anthropic"),
    "gate_chat_completions": ("spillbox.adapters", "gate_chat_completions"),
    "gate_responses": ("spillbox.adapters", "gate_responses"),
    "Budget": ("spillbox.budget", "Budget"),
    "BudgetExceeded": ("spillbox.budget", "BudgetExceeded"),
    "BudgetReport": ("spillbox.budget", "BudgetReport"),
    "Route": ("spillbox.budget", "Route"),
    "Fallback": ("spillbox.compaction", "Fallback"),
    "Policy": ("spillbox.config", "Policy"),
    "Settings": ("spillbox.config", "Settings"),
    "ConfigError": ("spillbox.errors", "ConfigError"),
    "ExecError": ("spillbox.errors", "ExecError"),
    "HostLostError": ("spillbox.errors", "HostLostError"),
    "RetentionError": ("spillbox.errors", "RetentionError"),
    "SandboxError": ("spillbox.errors", "SandboxError"),
    "SpillboxError": ("spillbox.errors", "SpillboxError"),
    "StorageError": ("spillbox.errors", "StorageError"),
    "Harness": ("spillbox.harness", "Harness"),
    "Task": ("spillbox.harness", "Task"),
    "LoopResult": ("spillbox.loop", "LoopResult"),
    "ScriptedModel": ("spillbox.loop", "ScriptedModel"),
    "ToolCall": ("spillbox.loop", "ToolCall"),
    "Turn": ("spillbox.loop", "Turn"),
    "UserTool": ("spillbox.loop", "UserTool"),
    "run_loop": ("spillbox.loop", "run"),
    "Capability": ("spillbox.native", "Capability"),
    "Native": ("spillbox.native", "Native"),
    "plan_native": ("spillbox.native", "plan_native"),
    "parse_notice": ("spillbox.notice", "parse_notice"),
    "Retention": ("spillbox.retention", "Retention"),
    "TiktokenCounter": ("spillbox.tokens", "TiktokenCounter"),
    "TokenCounter": ("spillbox.tokens", "TokenCounter"),
    "counter_for_model": ("spillbox.tokens", "counter_for_model"),
    "ToolOutput": ("spillbox.tools", "ToolOutput"),
    "ToolSpec": ("spillbox.tools", "ToolSpec"),
    "Toolset": ("spillbox.tools", "Toolset"),
    "Admitted": ("spillbox.types", "Admitted"),
    "Artifact": ("spillbox.types", "Artifact"),
    "ExecResult": ("spillbox.types", "ExecResult"),
    "Lang": ("spillbox.langs", "Lang"),
    "Reason": ("spillbox.types", "Reason"),
    "TokenCount": ("spillbox.types", "TokenCount"),
    "ToolResult": ("spillbox.types", "ToolResult"),
}
"""Each public name: the module it lives in and its name there."""


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'spillbox' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # found once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "Admitted",
    "Artifact",
    "Budget",
    "BudgetExceeded",
    "BudgetReport",
    "Capability",
    "ConfigError",
    "ExecError",
    "HostLostError",
    "ExecResult",
    "Fallback",
    "Harness",
    "Lang",
    "LoopResult",
    "Native",
    "Policy",
    "Reason",
    "Retention",
    "RetentionError",
    "Route",
    "SandboxError",
    "ScriptedModel",
    "Settings",
    "SpillboxError",
    "StorageError",
    "Task",
    "TiktokenCounter",
    "TokenCount",
    "TokenCounter",
    "ToolCall",
    "ToolOutput",
    "ToolResult",
    "ToolSpec",
    "Toolset",
    "Turn",
    "UserTool",
    "add_tools",
    "compact_history",
    "counter_for_model",
    "gate_anthropic",
    "gate_chat_completions",
    "gate_responses",
    "parse_notice",
    "plan_native",
    "run_loop",
]
