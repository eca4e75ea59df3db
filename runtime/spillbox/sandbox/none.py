"""The store-only backend: payloads are kept on the host; there is no code mode."""

from __future__ import annotations

from spillbox.errors import ExecError
from spillbox.sandbox.base import SandboxBackend
from spillbox.sandbox.storage import StoredFile, TaskStorage
from spillbox.types import ExecRequest, RawExec


class NoneBackend(SandboxBackend):
    """Stores payloads under the spillbox home; paths in notices are host paths."""

    kind = "none"

    def create(self, storage: TaskStorage) -> None:
        storage.ensure()

    def visible_path(self, stored: StoredFile) -> str:
        return str(stored.host_path)

    def exec(self, storage: TaskStorage, request: ExecRequest) -> RawExec:
        raise ExecError(
            "code mode needs a sandbox: this harness uses sandbox='none'; use sandbox='docker'"
        )

    def destroy_sandbox(self, storage: TaskStorage) -> None:
        return None  # storage is all there is
