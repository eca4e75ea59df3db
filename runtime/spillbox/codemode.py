"""Code mode: the model's scripts run in the task's sandbox; only their output returns, gated.

    result = task.exec("sql", 'SELECT state, count(*) FROM "c1" GROUP BY state')
    print(result.text)       # what the model sees; an oversized print becomes an artifact

Every artifact of a JSON, NDJSON or CSV shape is a table named after its id in SQL, and
each array of objects that a JSON object wraps a table of its records named by the id and
the array's path (records_table: "c1/items"); jq takes a filter and the artifact to run it
over; python has duckdb, pyarrow and jq; sh has jq and the usual tools.

python runs stateless by default (a fresh process per call); with session=True it runs as a
cell of the task's persistent Python session, where names from earlier session calls remain
(reset_session=True starts it afresh first):

    task.exec("python", "df = con.sql('SELECT * FROM \"c1\"').arrow()", session=True)
    task.exec("python", "df.num_rows", session=True)       # the table from the call before
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from spillbox.errors import ExecError, SpillboxError
from spillbox.langs import LANGS
from spillbox.notice import MAX_HINT_CHARS, Hint
from spillbox.profile import path_text
from spillbox.protocols import TaskHandle
from spillbox.redaction import redact
from spillbox.types import (
    IMAGE_TYPES,
    Artifact,
    ExecRequest,
    ExecResult,
    Image,
    RawExec,
    SessionCall,
    Shape,
    ToolResult,
)

DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 3600.0
STDERR_HEAD_CHARS = 2_000
STDERR_TAIL_CHARS = 2_000

MAX_IMAGES = 4
"""Images shown to the model per call; more are stored, named, and not shown."""
MAX_IMAGE_BYTES = 2 * 1024 * 1024
"""Largest image shown (every provider takes it: Anthropic's cap is 5 MB)."""
_IMAGE_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}

TABLE_SHAPES = ("json_array", "json_object", "ndjson", "csv")
"""Shapes that the SQL engine loads as a table named after the artifact."""


RawExecFn = Callable[[ExecRequest], RawExec]
"""Runs a request in the task's sandbox: the backend's exec, bound to the task."""


def run(
    task: TaskHandle,
    raw_exec: RawExecFn,
    lang: str,
    code: str,
    timeout: float,
    artifact: str | None = None,
    session: bool = False,
    reset_session: bool = False,
) -> ExecResult:
    """Run a script in the task's sandbox and gate what it printed."""
    if lang not in LANGS:
        raise ExecError(f"unknown language {lang!r}: use one of {', '.join(LANGS)}")
    call = session_call(lang, session, reset_session)
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ExecError(f"timeout must be between 0 and {MAX_TIMEOUT:.0f} seconds, got {timeout}")
    if lang == "jq":
        code = jq_command(task, code, artifact)
        lang = "sh"
    referenced = task.artifacts(include_deleted=True, named_in=code)
    try:
        raw = raw_exec(ExecRequest(lang, code, timeout, call))
    except SpillboxError as e:
        if not task.retention.redact:
            raise
        # The engine's own words can quote what it read; the original (with any secret)
        # is not chained on, as a traceback would show it.
        raise type(e)(redact(str(e))[0], retryable=e.retryable) from None
    stderr = raw.stderr.decode("utf-8", "replace")
    if task.retention.redact:
        # stderr reaches the model beside the gated stdout: a traceback or a failed CAST
        # quotes the values it choked on. Redacted whole, before it is cut to its ends.
        stderr = redact(stderr)[0]
    task.accessed([r for r in referenced if r.state == "live"], "query", f"sandbox_exec.{lang}")
    if raw.exit_code != 0:
        for row in referenced:
            if row.state != "live":
                stderr = f"{row.tombstone()}\n{stderr}"
    [admitted] = task.admit(
        [ToolResult(call_id=f"exec-{lang}", tool=f"sandbox_exec.{lang}", content=raw.stdout)]
    )
    files, images, notes = keep_files(task, raw, f"sandbox_exec.{lang}")
    if task.retention.redact:
        notes = tuple(redact(note)[0] for note in notes)  # they name what the script wrote
    return ExecResult(
        exit_code=raw.exit_code,
        text=admitted.text,
        stderr=bound_stderr(stderr),
        offloaded=admitted.offloaded,
        artifact=admitted.artifact,
        timed_out=raw.timed_out,
        oom_killed=raw.oom_killed,
        files=files,
        images=images,
        file_notes=notes,
    )


def keep_files(
    task: TaskHandle, raw: RawExec, tool: str
) -> tuple[tuple[Artifact, ...], tuple[Image, ...], tuple[str, ...]]:
    """Store the files a script left in /sandbox/outputs as artifacts; the PNG and JPEG
    ones (matplotlib figures among them) are also shown to the model, at most MAX_IMAGES
    per call and MAX_IMAGE_BYTES each. What was not stored or not shown is in the notes."""
    files: list[Artifact] = []
    images: list[Image] = []
    notes = list(raw.file_notes)
    for output in raw.files:
        try:
            artifact = task.store_file(output.name, output.data, tool)
        except SpillboxError as e:
            notes.append(f"{output.name}: not stored: {e}")
            continue
        files.append(artifact)
        mime = image_type(output.name, output.data)
        why = ""
        if mime is None:
            if output.name.lower().endswith(".svg"):
                why = "no model API takes SVG as an image (save a PNG to see it)"
        elif len(images) >= MAX_IMAGES:
            why = f"at most {MAX_IMAGES} images are shown per call"
        elif len(output.data) > MAX_IMAGE_BYTES:
            why = f"{len(output.data)} bytes, over the {MAX_IMAGE_BYTES}-byte cap of an image"
        else:
            images.append(Image(mime, output.data, artifact.path))
        if why:
            notes.append(f"{output.name}: stored as {artifact.path}, not shown: {why}")
    return tuple(files), tuple(images), tuple(notes)


def image_type(name: str, data: bytes) -> str | None:
    """The MIME type of an output file shown as an image: its extension says PNG or JPEG
    and its first bytes agree."""
    mime = IMAGE_TYPES.get(name.rpartition(".")[2].lower())
    return mime if mime is not None and data.startswith(_IMAGE_MAGIC[mime]) else None


def session_call(lang: str, session: bool, reset: bool) -> SessionCall | None:
    """What a call asks of the Python session: nothing (stateless), keep it, or reset it."""
    if not (session or reset):
        return None
    if lang != "python":
        raise ExecError(
            f"the persistent session is Python's: session and reset_session go with lang "
            f"python, not {lang}"
        )
    return "reset" if reset else "keep"


def jq_command(task: TaskHandle, jq_filter: str, artifact: str | None) -> str:
    """The sh command that runs a jq filter over one artifact of the task."""
    if artifact is None:
        raise ExecError("jq needs an artifact to run over: pass artifact=ID (or --artifact ID)")
    path = task.artifact(artifact).path
    # jq 1.6 has no `--`: a leading space keeps a filter like "-1" from reading as an option.
    return f"jq {shell_quote(' ' + jq_filter)} {shell_quote(path)}"


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def bound_stderr(stderr: str) -> str:
    """Keep the head and the tail of stderr: a traceback's last line is the one that matters."""
    if len(stderr) <= STDERR_HEAD_CHARS + STDERR_TAIL_CHARS:
        return stderr
    dropped = len(stderr) - STDERR_HEAD_CHARS - STDERR_TAIL_CHARS
    return (
        f"{stderr[:STDERR_HEAD_CHARS]}\n[spillbox: {dropped} characters of stderr omitted]\n"
        f"{stderr[-STDERR_TAIL_CHARS:]}"
    )


def table_name(artifact_id: str) -> str:
    """The SQL identifier of an artifact's table, quoted."""
    return '"' + artifact_id.replace('"', '""') + '"'


def records_table(artifact_id: str, path: tuple[str, ...]) -> str:
    """The SQL identifier, quoted, of the table of the records at path in a JSON object:
    the id, "/" (no id holds one) and the path as the notice writes it, printable ASCII
    whatever the keys hold. The SQL engine (sqlserver.py) names it so when it loads the
    object: one row per record, queried as fast as a bare array of them."""
    return table_name(f"{artifact_id}/{path_text(path)}")


def hints(artifact: Artifact, languages: Sequence[str]) -> list[Hint]:
    """One or two ready-to-run inspections of an artifact, in languages the sandbox has."""
    found: list[Hint] = []
    shape = artifact.shape
    records = shape.records if shape.kind == "json_object" else None
    if records is not None:
        found = [
            hint
            for hint in _records_hints(artifact, records.path, languages)
            if len(hint.code) <= MAX_HINT_CHARS
        ]
        if found or not all(_nameable(key, "sql") for key in records.path):
            return found  # a key DuckDB cannot name (a lone surrogate) fails its load too
        # No hint over a path this long fits the notice: the object's own table does.
    if "sql" in languages and shape.kind in TABLE_SHAPES:
        table = table_name(artifact.id)
        if shape.kind == "json_object":
            found.append(Hint("sql", f"DESCRIBE {table}"))
        else:
            columns = ", ".join(table_name(k) for k in _named_columns(shape.keys)) or "*"
            found.append(Hint("sql", f"SELECT count(*) AS n FROM {table}"))
            found.append(Hint("sql", _cut(shape, f"SELECT {columns} FROM {table} LIMIT 5")))
    elif "sh" in languages and shape.kind in ("text", "json_scalar"):
        # grep exits 1 when nothing matches; a hint must succeed on a clean log too.
        found.append(
            Hint(
                "sh",
                f"grep -n -i -m 20 -E 'error|fail|exception' {artifact.path} "
                "|| echo 'no error lines'",
            )
        )
        found.append(Hint("sh", f"tail -n 20 {artifact.path}"))
    elif "sh" in languages and shape.kind == "binary":
        found.append(Hint("sh", f"od -A d -t x1 {artifact.path} | head -n 8"))
    return found or [recovery_hint(artifact, languages)]


def recovery_hint(artifact: Artifact, languages: Sequence[str]) -> Hint:
    """A way back to an artifact that needs neither code mode nor registered tools (a
    store-only harness that offers the model no tools): the CLI's read_artifact call, on
    the same store, for whoever runs the harness. No notice is left without a route."""
    sandbox = "" if languages else " --sandbox none"
    arguments = json.dumps({"artifact_id": artifact.id}, ensure_ascii=False)
    task = shell_quote(artifact.task_id)
    return Hint(
        "cli", f"spillbox call{sandbox} --task {task} read_artifact {shell_quote(arguments)}"
    )


def _named_columns(keys: Sequence[str]) -> list[str]:
    """Up to three columns a hint can name as DuckDB loads them: short printable keys
    without outer spaces (its CSV reader trims them)."""
    if not _loaded_as_columns(keys):
        return []
    return [k for k in keys if k.isprintable() and len(k) <= 40 and k == k.strip()][:3]


def _loaded_as_columns(keys: Sequence[str]) -> bool:
    """Whether DuckDB loads a table with these keys as one column per key. Its names
    ignore case: objects with two keys that differ only in case, or with an empty key,
    it loads as one MAP column, and such CSV columns it renames."""
    return "" not in keys and len({key.casefold() for key in keys}) == len(keys)


def _nameable(key: str, lang: str) -> bool:
    """Whether a hint in lang can name key: jq 1.6 refuses a lone surrogate's escape,
    and DuckDB's names cannot hold one (not UTF-8), nor NUL (a name ends there), nor
    be empty."""
    if any("\ud800" <= char <= "\udfff" for char in key):
        return False
    return lang != "sql" or (key != "" and "\x00" not in key)


JQ_WHOLE_MAX_BYTES = 16 * 1024 * 1024
"""Wrapped records in a payload over this size get jq hints that stream (--stream): jq
parsing 72 MB whole was killed at the sandbox's 1 GB memory limit."""


def _records_hints(
    artifact: Artifact, path: tuple[str, ...], languages: Sequence[str]
) -> list[Hint]:
    """For records wrapped in an object: SQL over the table of its records (one row per
    record), jq over the path, and jq showing the envelope (the object without its
    records)."""
    found: list[Hint] = []
    nameable = {lang: all(_nameable(key, lang) for key in path) for lang in ("sql", "sh")}
    if "sql" in languages and nameable["sql"] and _loaded_as_columns(artifact.shape.keys):
        rows = f"SELECT * FROM {records_table(artifact.id, path)} LIMIT 5"
        found.append(Hint("sql", _cut(artifact.shape, rows)))
    if not ("sh" in languages and nameable["sh"]):
        return found
    if artifact.bytes > JQ_WHOLE_MAX_BYTES:
        # jq 1.6 holds a document it parses whole at many times its size: past this, it
        # reads the events of --stream, keeping one record at a time.
        under = json.dumps(list(path))
        records = (
            f"limit(2; fromstream({len(path) + 1}|truncate_stream("
            f"inputs | select(.[0][:{len(path)}] == {under}))))"
        )
        envelope = (
            f"fromstream(inputs | select(.[0][:{len(path)}] != {under} or (.[0]|length) == 1))"
        )
        for jq_filter in (records, envelope):
            jq_filter = _jq_cut(artifact.shape, jq_filter)
            found.append(Hint("sh", f"jq -cn --stream {shell_quote(jq_filter)} {artifact.path}"))
    else:
        jq_path = "." + path_text(path)
        for jq_filter in (jq_path + "[:2][]", f"del({jq_path})"):
            jq_filter = _jq_cut(artifact.shape, jq_filter)
            found.append(Hint("sh", f"jq -c {shell_quote(jq_filter)} {artifact.path}"))
    return found


CUT_CHARS = 80
"""What a hint shows of each value (SQL) or long string (jq) in a payload with long
base64 strings (Shape.long_strings): an image's base64 printed whole would be offloaded
again, a notice answering a notice."""


def _cut(shape: Shape, select: str) -> str:
    """A SQL hint's SELECT, its every value cut to CUT_CHARS where the payload has long
    base64 strings (a record's blob is in a column, or a struct's text)."""
    if not shape.long_strings:
        return select
    return f"SELECT left(CAST(COLUMNS(*) AS VARCHAR), {CUT_CHARS}) FROM ({select})"


def _jq_cut(shape: Shape, jq_filter: str) -> str:
    """A jq hint's filter, its long strings cut to CUT_CHARS (saying how long they were)
    where the payload has long base64 strings."""
    if not shape.long_strings:
        return jq_filter
    return (
        f'{jq_filter} | walk(if type == "string" and length > {CUT_CHARS} '
        f'then "\\(.[:{CUT_CHARS}])... (\\(length) chars)" else . end)'
    )
