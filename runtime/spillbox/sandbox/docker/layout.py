"""The sandbox as its image lays it out: the two uids, the mounts, the runner, the SQL engine.

SCRIPT_UID runs the model's scripts; ENGINE_UID runs PID 1 and the task's SQL engine, so a
script can neither kill the container nor tamper with the engine.
"""

from __future__ import annotations

SCRIPT_UID = 10001
ENGINE_UID = 10002
SANDBOX_GID = 10001
SCRIPT_USER = f"{SCRIPT_UID}:{SANDBOX_GID}"
ENGINE_USER = f"{ENGINE_UID}:{SANDBOX_GID}"

SANDBOX_ROOT = "/sandbox"
OFFLOAD_MOUNT = f"{SANDBOX_ROOT}/offload"
WORK_MOUNT = f"{SANDBOX_ROOT}/work"
CACHE_MOUNT = f"{SANDBOX_ROOT}/cache"
RUN_SCRIPT = "/opt/spillbox/run.sh"
SQL_ENGINE = "/opt/spillbox/sqlserver.py"
FORGET_SCRIPT = "/opt/spillbox/forget.py"
