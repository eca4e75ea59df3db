"""spillbox: a sandbox offload runtime for agent loops.

Every tool result passes the gate; results too large for the model's context are stored
byte for byte in the task's sandbox, and the model gets a compact notice instead.
"""

from __future__ import annotations

from spillbox.codemode import ExecResult, Lang
from spillbox.config import Policy, Settings
from spillbox.errors import (
    ConfigError,
    ExecError,
    SandboxError,
    SpillboxError,
    StorageError,
)
from spillbox.gate import Reason, ToolResult
from spillbox.harness import Admitted, Artifact, Harness, Task
from spillbox.notice import parse_notice
from spillbox.tokens import TiktokenCounter, TokenCount, TokenCounter

__all__ = [
    "Admitted",
    "Artifact",
    "ConfigError",
    "ExecError",
    "ExecResult",
    "Harness",
    "Lang",
    "Policy",
    "Reason",
    "SandboxError",
    "Settings",
    "SpillboxError",
    "StorageError",
    "Task",
    "TiktokenCounter",
    "TokenCount",
    "TokenCounter",
    "ToolResult",
    "parse_notice",
]
