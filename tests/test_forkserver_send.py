"""The fork server's vouched send (forkserver.py, run here on the host): a message that
sendmsg took whole is sent, whatever the other end does next."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

RUNTIME = Path(__file__).parents[1] / "sandbox_images" / "sandbox" / "runtime"


class AnsweredAtOnce(socket.socket):
    """A socket whose peer reads the message and closes at once, as the fork server does
    for a script that cannot start (an sh script with a NUL byte): on a loaded machine
    that can happen between the relay's sendmsg and whatever it does next."""

    peer: socket.socket
    received = b""

    def sendmsg(self, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        sent = super().sendmsg(*args, **kwargs)
        self.received = self.peer.recv(1 << 16)
        self.peer.close()
        return sent


def test_a_request_sent_whole_does_not_fail_when_its_answerer_has_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(RUNTIME))
    import forkserver

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    relay = AnsweredAtOnce(socket.AF_UNIX, socket.SOCK_STREAM, fileno=ours.detach())
    relay.peer = theirs
    request = b'{"lang": "sh", "code": "echo a\\u0000b"}\n'
    with relay:
        forkserver.send_vouched(relay, request)
    assert relay.received == request  # whole, in the one sendmsg that carries the credentials
