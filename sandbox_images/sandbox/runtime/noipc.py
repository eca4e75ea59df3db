"""No script or cell makes a System V IPC object or a POSIX message queue: such an object
holds bytes past every process, in no folder a deletion walks. The container's IPC limits
(0) refuse them under runc; gVisor ignores those limits, so the fork server and the session
relay each install this seccomp filter before they run anything, and every process they
start inherits it and cannot remove it (no-new-privileges). Refused calls fail with EPERM.

    import noipc; noipc.install()
"""

from __future__ import annotations

import ctypes
import platform
import struct

_ARCHES = {  # the audit arch, and the syscalls that make an object: shmget, semget, msgget, mq_open
    "x86_64": (0xC000003E, (29, 64, 68, 240)),
    "aarch64": (0xC00000B7, (194, 190, 186, 180)),
}
_X32_BIT = 0x40000000
"""x86_64's x32 ABI: the same calls under other numbers (refused whole)."""

_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter: calls of another arch (int 0x80 from a 64-bit process, say) are refused
    whole; of this arch, the calls that make an IPC object; everything else is allowed."""
    arch, denied = _ARCHES[machine]
    checks: list[tuple[int, int, int, int]] = []
    if machine == "x86_64":
        checks.append((_JGE_K, 0, 0, _X32_BIT))
    checks += [(_JEQ_K, 0, 0, number) for number in denied]
    # Each check jumps to the last instruction (refuse) when it holds: its distance there.
    jumps = [(op, len(checks) - i, 0, k) for i, (op, _, _, k) in enumerate(checks)]
    return [
        (_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ_K, 1, 0, arch),
        (_RET_K, 0, 0, _EPERM),
        (_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        *jumps,
        (_RET_K, 0, 0, _ALLOW),
        (_RET_K, 0, 0, _EPERM),
    ]


def install() -> None:
    """Refuse IPC objects to this process and all it starts; an OSError if the kernel (or
    gVisor) does not take the filter: nothing may then run."""
    program = _program(platform.machine())
    raw = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in program))
    libc = ctypes.CDLL(None, use_errno=True)
    fprog = _Program(len(program), ctypes.cast(raw, ctypes.c_void_p))
    for call in (
        lambda: libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        lambda: libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
    ):
        if call() != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"installing the IPC filter failed (errno {errno})")
