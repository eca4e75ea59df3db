"""The frame protocol's names are defined twice, once on each side of the exec (the image
cannot import the host package): the two copies agree, and a frame the image writes is the
frame the host reads."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from types import ModuleType

from spillbox.sandbox.docker import wire

IMAGE_WIRE = Path(__file__).parents[1] / "sandbox_images" / "sandbox" / "runtime" / "wire.py"
TAGS = ("STARTED", "NO_SERVER", "STDOUT", "STDERR", "END", "FILE", "NOTE")


def image_wire() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_wire", IMAGE_WIRE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_image_and_the_host_name_the_same_tags() -> None:
    image = image_wire()
    assert {tag: getattr(image, tag) for tag in TAGS} == {tag: getattr(wire, tag) for tag in TAGS}
    assert len({getattr(wire, tag) for tag in TAGS}) == len(TAGS)


def test_what_the_image_writes_the_host_reads_in_any_pieces() -> None:
    out = io.BytesIO()
    image = image_wire()
    image.frame(out, wire.STDOUT, b"x" * 70_000)
    image.frame(out, wire.STDERR, "é")
    image.frame(out, wire.END, '{"exit_code": 0}')
    written = out.getvalue()
    frames = wire.Frames()
    read = []
    for start in range(0, len(written), 4097):
        frames.feed(written[start : start + 4097])
        read.extend(frames)
    assert read == [
        (wire.STDOUT, b"x" * 70_000),
        (wire.STDERR, "é".encode()),
        (wire.END, b'{"exit_code": 0}'),
    ]
    assert frames.leftover() == b""
