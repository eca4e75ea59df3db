"""The data spillbox passes around: frozen records, and the literal types of its modes.

This module imports nothing else from spillbox, so every other module can use these types
without importing the module that makes them (no import cycles, no `object` in place of a
type).

    from spillbox.types import ToolResult
    result = ToolResult(call_id="c1", tool="list_prs", content=payload)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

Reason = Literal["per_call", "aggregate", "binary", "compaction", "withheld", "output", "refused"]
"""Why a result's place in context is not the result itself (see spillbox.gate; "refused":
Task.admit's one-line error for a result over its size cap or with an id that is not text)."""

Origin = Literal["call", "file", "append"]
"""Where an artifact came from: a tool call's result, a file a script left, or appends
under one call id (a task's history, Task.append)."""

SessionCall = Literal["keep", "reset"]
"""A python call into the task's persistent session: as it is, or reset to empty first."""

ShapeKind = Literal["json_array", "json_object", "json_scalar", "ndjson", "csv", "text", "binary"]

EXTENSIONS: dict[ShapeKind, str] = {
    "json_array": "json",
    "json_object": "json",
    "json_scalar": "json",
    "ndjson": "ndjson",
    "csv": "csv",
    "text": "txt",
    "binary": "bin",
}
"""The file extension a payload of each shape is stored with."""


SIZE_CHUNK = 1 << 20
"""Characters encoded at a time to count a text's UTF-8 bytes (ToolResult.size)."""
LARGE_TEXT_BYTES = 1 << 20
"""From this size a payload given as ASCII bytes is read as LargeText, never decoded whole."""


class LargeText:
    """The text of a large payload given as bytes, read a slice at a time: the gate needs
    only its length and windows of it (the count's prefixes and samples, the profile's
    head, the notice's ends), and the payload is then held once, not as bytes and str.
    ASCII only, so that a character's index is its byte's.

    >>> text = LargeText(b"[1, 2, 3]")
    >>> len(text), text[:2], text[-2:]
    (9, '[1', '3]')
    """

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: slice) -> str:
        return self.data[key].decode("ascii")

    def __str__(self) -> str:
        return self.data.decode("ascii")


Text = str | LargeText
"""A payload's text: a str, or the bytes of a large ASCII one (LargeText)."""


def text_of(data: bytes) -> Text | None:
    """data as text: valid UTF-8 without NUL (None otherwise); LargeText from
    LARGE_TEXT_BYTES when it is ASCII, else decoded."""
    if len(data) >= LARGE_TEXT_BYTES and data.isascii():
        return None if b"\0" in data else LargeText(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\0" in text else text


@dataclass(frozen=True)
class ToolResult:
    """One tool call's result, as the tool returned it.

    >>> ToolResult(call_id="c1", tool="list_prs", content='[{"id": 1}]').is_error
    False
    """

    call_id: str
    tool: str
    content: str | bytes
    is_error: bool = False
    offloadable: bool = True
    """False: the aggregate rule withholds the result instead of offloading it (a page
    read back from an artifact: already bounded, and offloading it would loop)."""
    file_name: str | None = None
    """The name its stored file keeps, stem and extension, where they are plain (a file
    offloaded from the command line, a script's output file); None: the call id, with the
    extension of the payload's shape."""

    def __post_init__(self) -> None:
        for name, value in (("call_id", self.call_id), ("tool", self.tool)):
            if not isinstance(value, str):
                raise TypeError(f"ToolResult.{name} must be a str, not {type(value).__name__}")
        content = self.content
        if isinstance(content, bytearray | memoryview):
            object.__setattr__(self, "content", bytes(content))  # what they hold now, kept
        elif not isinstance(content, str | bytes):
            raise TypeError(
                f"ToolResult.content must be str or bytes, not {type(content).__name__}: "
                "give the tool's output as text (json.dumps for data) or as its bytes"
            )

    def size(self) -> int:
        """How many bytes payload() stores, counted without encoding the content whole."""
        content = self.content
        if isinstance(content, bytes) or content.isascii():
            return len(content)
        return sum(
            len(content[at : at + SIZE_CHUNK].encode("utf-8", "surrogatepass"))
            for at in range(0, len(content), SIZE_CHUNK)
        )

    def payload(self) -> tuple[bytes, Text | None]:
        """The bytes to store, and the text they are (None if they are not text).

        Text is valid UTF-8 without NUL: no JSON, CSV or log holds a raw NUL, while
        binary formats (tar, NUL-padded headers) can be valid UTF-8 by chance, and a NUL
        in context is refused by some model APIs. A str is stored as its UTF-8 encoding;
        one with lone surrogates (not encodable) keeps them via surrogatepass and is then
        handled as the non-UTF-8 bytes it is. Bytes are read as text_of reads them.
        """
        if isinstance(self.content, bytes):
            return self.content, text_of(self.content)
        try:
            data = self.content.encode("utf-8")
        except UnicodeEncodeError:
            return self.content.encode("utf-8", "surrogatepass"), None
        return data, None if "\0" in self.content else self.content


@dataclass(frozen=True)
class TokenCount:
    """A token total, and whether it was counted exactly or estimated from samples."""

    tokens: int
    exact: bool

    def label(self) -> str:
        return f"{self.tokens}" if self.exact else f"~{self.tokens} (estimated)"


@dataclass(frozen=True)
class ArrayFacts:
    """An array inside a JSON object, reached from the top through object keys only."""

    path: tuple[str, ...]
    """The keys from the top, e.g. ("data", "search", "nodes")."""
    count: int | None
    """Its elements; None if not known."""
    count_exact: bool = True
    element: str | None = None
    """What its elements are: "objects", "strings", "mixed values"... (None: empty)."""


@dataclass(frozen=True)
class Shape:
    """The shape of one payload, as the notice states it."""

    kind: ShapeKind
    count: int | None = None
    """Elements of a JSON array, NDJSON records, CSV rows or text lines; None if not known."""
    count_exact: bool = True
    element: str | None = None
    """What the elements of an array are: "objects", "numbers", "mixed"..."""
    keys: tuple[str, ...] = ()
    """Object keys (of the object, or of the array's objects), or CSV columns, first seen first."""
    nested: dict[str, str] = field(default_factory=dict)
    """For a JSON object: a short type per key ("array", "object", "string"...)."""
    mime: str | None = None
    """For binary payloads: the sniffed type, if any."""
    arrays: tuple[ArrayFacts, ...] = ()
    """For a JSON object: its arrays reached through keys (a path of up to four), in the
    order they open; counts beyond the profile's budget are estimates and say so."""
    long_strings: bool = False
    """For JSON: whether it holds a base64 or hex string (an image, a file's blob) of
    profile.LONG_STRING_CHARS or more, which a hint that prints values shows cut."""

    @property
    def records(self) -> ArrayFacts | None:
        """For a JSON object: where its records are, the largest array of objects (ties:
        the first); None if it holds none."""
        found = [facts for facts in self.arrays if facts.element == "objects"]
        return max(found, key=lambda facts: facts.count or 0, default=None)

    @property
    def extension(self) -> str:
        return EXTENSIONS[self.kind]


@dataclass(frozen=True)
class Artifact:
    """An offloaded payload, stored byte for byte in the task's sandbox."""

    id: str
    """Unique in the task: the file name's stem."""
    task_id: str
    call_id: str
    tool: str
    name: str
    """File name in the task's offload folder."""
    path: str
    """Where the model and its scripts find it (e.g. /sandbox/offload/c1.json)."""
    host_path: Path
    bytes: int
    sha256: str
    shape: Shape
    tokens: TokenCount | None


@dataclass(frozen=True)
class Admitted:
    """One result after the gate, in the order the results were given."""

    call_id: str
    tool: str
    text: str
    """What goes into the model's context: the result itself, or a notice."""
    offloaded: bool
    reason: Reason | None
    tokens: int | None
    """Tokens of the whole result (None for binary results)."""
    tokens_exact: bool | None
    inline_tokens: int
    """Tokens of text."""
    artifact: Artifact | None
    is_error: bool = False


@dataclass(frozen=True)
class OutputFile:
    """A file a script left in the sandbox's output folder, as the host received it."""

    name: str
    """Its name in the folder: one path component, printable (the sandbox checks it)."""
    data: bytes


IMAGE_TYPES: dict[str, str] = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg"}
"""Output files shown to the model as images, by extension: the formats every provider
accepts (SVG is not one: it is stored and named, not shown)."""


@dataclass(frozen=True)
class Image:
    """An image a script left (a file, or a matplotlib figure saved as PNG), as the model is
    shown it: the bytes of the artifact at `path`."""

    mime: str
    """"image/png" or "image/jpeg"."""
    data: bytes
    path: str
    """The artifact it is stored as, as the sandbox sees it."""

    def base64(self) -> str:
        import base64

        return base64.b64encode(self.data).decode("ascii")

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{self.base64()}"


@dataclass(frozen=True)
class ExecRequest:
    """One script for a task's sandbox, as every backend's exec takes it.

    >>> ExecRequest("sql", 'SELECT count(*) FROM "c1"', timeout=30.0).session is None
    True
    """

    lang: str
    """The sandbox's language: "sql", "python" or "sh" (a jq filter reaches it as sh)."""
    code: str
    timeout: float
    """Seconds the script may run before it is killed."""
    session: SessionCall | None = None
    """A python cell in the task's persistent session (as it is, or reset first); None:
    a stateless script."""


@dataclass(frozen=True)
class RawExec:
    """What a script did, before the gate sees its output."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    oom_killed: bool
    stdout_truncated: bool = False
    """True if stdout was over the backend's output cap; the middle was dropped, not the tail."""
    files: tuple[OutputFile, ...] = ()
    """What the script left in the output folder (taken out of it: the folder is emptied)."""
    file_notes: tuple[str, ...] = ()
    """Entries of the output folder that were not taken, and why (one line each)."""


@dataclass(frozen=True)
class ExecResult:
    """What a script did, as the model sees it."""

    exit_code: int
    text: str
    """The script's stdout after the gate: inline, or the notice of a new artifact."""
    stderr: str
    """The script's stderr, bounded: its head and its tail (where errors usually are)."""
    offloaded: bool
    artifact: Artifact | None
    timed_out: bool
    oom_killed: bool
    files: tuple[Artifact, ...] = ()
    """The artifacts made of the files the script left in the output folder."""
    images: tuple[Image, ...] = ()
    """Those of them shown to the model as images (bounded in count and size per call)."""
    file_notes: tuple[str, ...] = ()
    """Output files not stored or not shown, and why."""

    def as_json(self) -> dict[str, object]:
        """The result as the sandbox_exec tool returns it to the model, and as `spillbox exec
        --json` prints it: one set of keys everywhere."""
        return {
            "exit_code": self.exit_code,
            "output": self.text,
            "stderr": self.stderr,
            "timed_out": self.timed_out,
            "oom_killed": self.oom_killed,
            "offloaded": self.offloaded,
            "path": self.path,
            "files": [
                {
                    "path": f.path,
                    "bytes": f.bytes,
                    "shown": any(i.path == f.path for i in self.images),
                }
                for f in self.files
            ],
            "file_notes": list(self.file_notes),
        }

    @property
    def path(self) -> str | None:
        return self.artifact.path if self.artifact else None


@dataclass(frozen=True)
class ArtifactRow:
    """An artifact as the catalog knows it (live, or a tombstone)."""

    task_id: str
    artifact_id: str
    call_id: str
    tool: str
    name: str
    path: str
    bytes: int
    tokens: int | None
    tokens_exact: bool | None
    sha256: str
    created_at: float
    last_access_at: float
    expires_at: float | None
    state: str
    pinned: bool
    redactions: int
    deleted_at: float | None
    deleted_by: str | None
    kind: str | None = None
    """The payload's shape kind (spillbox.types.ShapeKind); None if recorded before it was kept."""
    origin: Origin = "call"
    """"call": a tool call's result (call_id is the model's id of that call); "file": a file
    a script left (call_id is the file's name); "append": what Task.append stored under
    call_id, grown in place by each append (never a copy of another artifact's bytes)."""

    def tombstone(self) -> str:
        """What a read or query of this artifact says once it is deleted."""
        when = datetime.fromtimestamp(self.deleted_at or 0, UTC).isoformat(timespec="seconds")
        return (
            f"artifact {self.artifact_id} of task {self.task_id} was deleted at {when} "
            f"by policy {self.deleted_by}"
        )


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    created_at: float
    closed_at: float | None
    delete_after: float | None
    retention: str
    state: str
    deleted_at: float | None
    deleted_by: str | None


@dataclass(frozen=True)
class AccessEntry:
    id: int
    task_id: str
    artifact_id: str | None
    action: str
    at: float
    actor: str
    detail: str
