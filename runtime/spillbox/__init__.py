"""spillbox: a sandbox offload runtime for agent loops.

Every tool result passes the gate; results too large for the model's context are stored
byte for byte in the task's sandbox, and the model gets a compact notice instead.
"""

from __future__ import annotations

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
    RetentionError,
    SandboxError,
    SpillboxError,
    StorageError,
)
from spillbox.harness import Harness, Task
from spillbox.loop import LoopResult, ScriptedModel, ToolCall, Turn, UserTool
from spillbox.loop import run as run_loop
from spillbox.native import Capability, Native, plan_native
from spillbox.notice import parse_notice
from spillbox.retention import Retention
from spillbox.tokens import TiktokenCounter, TokenCounter, counter_for_model
from spillbox.tools import ToolOutput, Toolset, ToolSpec
from spillbox.types import Admitted, Artifact, ExecResult, Lang, Reason, TokenCount, ToolResult

__all__ = [
    "Admitted",
    "Artifact",
    "Budget",
    "BudgetExceeded",
    "BudgetReport",
    "Capability",
    "ConfigError",
    "ExecError",
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
