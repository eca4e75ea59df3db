"""The sandbox as its image lays it out: the three uids, the mounts, the fork server, the SQL
engine, the Python session.

SCRIPT_UID runs the model's stateless scripts; ENGINE_UID runs PID 1 and the task's SQL
engine, so a script can neither kill the container nor tamper with the engine; SESSION_UID
runs the task's Python session, which no script can reach and no sweep of the script uid
ends. All three share SANDBOX_GID, the group that may write /sandbox/work.
"""

from __future__ import annotations

SCRIPT_UID = 10001
ENGINE_UID = 10002
SANDBOX_GID = 10001
SESSION_UID = 10003
SCRIPT_USER = f"{SCRIPT_UID}:{SANDBOX_GID}"
ENGINE_USER = f"{ENGINE_UID}:{SANDBOX_GID}"
SESSION_USER = f"{SESSION_UID}:{SANDBOX_GID}"

SANDBOX_ROOT = "/sandbox"
OFFLOAD_MOUNT = f"{SANDBOX_ROOT}/offload"
WORK_MOUNT = f"{SANDBOX_ROOT}/work"
OUTPUTS_MOUNT = f"{SANDBOX_ROOT}/outputs"
"""Files a script leaves here are taken after each call and become artifacts (takeout.py)."""
CACHE_MOUNT = f"{SANDBOX_ROOT}/cache"
RUN_MOUNT = f"{SANDBOX_ROOT}/run"
"""The Python session's socket, lock and log: a small tmpfs of the session uid alone."""
FORK_SERVER = "/opt/spillbox/forkserver.py"
SQL_ENGINE = "/opt/spillbox/sqlserver.py"
FORGET_SCRIPT = "/opt/spillbox/forget.py"
TAKEOUT_SCRIPT = "/opt/spillbox/takeout.py"
SESSION_SCRIPT = "/opt/spillbox/session.py"
