"""A payload's sha256, begun as soon as its bytes exist.

Hashing releases the GIL, so a large payload's digest, begun in a thread of its own when
the gate has the payload's bytes, runs on a second core while the gate estimates its
tokens, profiles it and writes it: storing it then waits for the hash only if that is
the longest of them.
"""

from __future__ import annotations

import hashlib
import threading

PARALLEL_HASH_BYTES = 1024 * 1024
"""From this size a payload's digest is computed in a thread of its own."""


class Digest:
    """The sha256 of data: from PARALLEL_HASH_BYTES begun at once in a thread of its own;
    below that, computed in the caller's thread when first asked for (a thread start
    costs more than hashing a few KB).

    >>> Digest(b"[1, 2]").hexdigest()[:12]
    '3a316d6d3226'
    """

    def __init__(self, data: bytes) -> None:
        self.data = data
        """What is hashed (the digest of other bytes is not this one)."""
        self._hex = ""
        self._thread: threading.Thread | None = None
        if len(data) >= PARALLEL_HASH_BYTES:
            self._thread = threading.Thread(target=self._hash, name="spillbox-sha256", daemon=True)
            self._thread.start()

    @classmethod
    def of(cls, data: bytes, given: Digest | None) -> Digest:
        """given if it is data's (begun earlier, by the gate), else data's begun now."""
        return given if given is not None and given.data is data else cls(data)

    def _hash(self) -> None:
        self._hex = hashlib.sha256(self.data).hexdigest()

    def hexdigest(self) -> str:
        if self._thread is not None:
            self._thread.join()
        if not self._hex:  # small, or the thread failed (out of memory): hashed here, or raised
            self._hash()
        return self._hex
