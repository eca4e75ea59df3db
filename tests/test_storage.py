"""Task storage: byte-exact, atomic writes under safe names that never leave the task."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spillbox.digest import PARALLEL_HASH_BYTES, Digest
from spillbox.errors import StorageError
from spillbox.sandbox.storage import TaskStorage, safe_name, stored_task_ids

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

nasty_ids = st.one_of(
    st.text(max_size=50),
    st.text(max_size=2_000),
    st.sampled_from(
        ["..", ".", "../../etc/passwd", "/abs/path", "a/b/../c", "", " ", "\x00", "-rf", "CON"]
    ),
    st.lists(st.sampled_from(["..", "/", "a", "é", "中", "😀", "\\", ".", "\n"]), max_size=300).map(
        "".join
    ),
)


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


@pytest.mark.parametrize("ident", ["call_1", "c1", "toolu_01A09q90qw90lq917835lq9", "a.b-c"])
def test_plain_ids_are_their_own_names(ident: str) -> None:
    assert safe_name(ident) == ident


def test_unsafe_ids_get_a_cleaned_prefix_and_a_digest() -> None:
    digest = hashlib.sha256(b"../../etc/passwd").hexdigest()[:32]
    assert safe_name("../../etc/passwd") == f"etc_passwd--{digest}"
    assert safe_name("..") == "id--" + hashlib.sha256(b"..").hexdigest()[:32]


@settings(max_examples=300, deadline=None)
@given(ident=nasty_ids)
def test_safe_name_is_a_short_plain_filename(ident: str) -> None:
    name = safe_name(ident)
    assert NAME.fullmatch(name)
    assert name not in (".", "..")
    assert len(name.encode()) <= 64


@settings(max_examples=200, deadline=None)
@given(a=nasty_ids, b=nasty_ids)
def test_distinct_ids_keep_distinct_names(a: str, b: str) -> None:
    if a != b:
        assert safe_name(a) != safe_name(b)


@settings(max_examples=120, deadline=None)
@given(task_id=nasty_ids, call_id=nasty_ids, data=st.binary(max_size=2_000))
def test_any_bytes_under_any_id_are_stored_exactly_inside_the_task(
    task_id: str, call_id: str, data: bytes
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        storage = TaskStorage(home, task_id)
        stored = storage.write(safe_name(call_id), "bin", data)
        assert stored.host_path.read_bytes() == data
        assert stored.bytes == len(data)
        assert stored.sha256 == hashlib.sha256(data).hexdigest()
        assert _inside(stored.host_path, storage.offload)
        assert _inside(storage.root, home / "tasks")
        assert storage.read(stored.name) == data
        assert list(storage.incoming.iterdir()) == []  # no temp file left behind
        assert stored_task_ids(home) == [task_id]


def test_a_taken_name_gets_a_suffix_and_the_first_file_is_kept(home: Path) -> None:
    storage = TaskStorage(home, "t1")
    first = storage.write("c1", "json", b"[1]")
    second = storage.write("c1", "json", b"[2]")
    assert (first.name, second.name) == ("c1.json", "c1-2.json")
    assert first.host_path.read_bytes() == b"[1]"
    assert second.host_path.read_bytes() == b"[2]"
    assert storage.names() == ["c1.json", "c1-2.json"]


def test_a_taken_stem_gets_a_suffix_under_any_extension(home: Path) -> None:
    # The stem is the artifact id: c1.txt beside c1.json would be a second artifact "c1".
    storage = TaskStorage(home, "t1")
    first = storage.write("c1", "json", b"[1]")
    second = storage.write("c1", "txt", b"text")
    third = storage.write("c1-2", "csv", b"a\n1\n")
    assert [f.artifact_id for f in (first, second, third)] == ["c1", "c1-2", "c1-2-2"]
    assert storage.names() == ["c1.json", "c1-2.txt", "c1-2-2.csv"]


def test_stored_files_are_readable_and_complete(home: Path) -> None:
    storage = TaskStorage(home, "t1")
    data = os.urandom(3 * 1024 * 1024)
    assert len(data) >= PARALLEL_HASH_BYTES  # hashed in a thread while written
    stored = storage.write("big", "bin", data)
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    assert stat.S_IMODE(stored.host_path.stat().st_mode) == 0o644
    assert stored.host_path.stat().st_size == len(data)
    assert stored.host_path.stat().st_nlink == 1  # the temp link is gone


@pytest.mark.parametrize("size", [10, PARALLEL_HASH_BYTES])
def test_a_digest_given_for_other_bytes_is_not_taken(home: Path, size: int) -> None:
    storage = TaskStorage(home, "t1")
    data, other = os.urandom(size), os.urandom(size)
    with storage.stage(data, digest=Digest(other)) as staged:
        assert staged.sha256 == hashlib.sha256(data).hexdigest()
    with storage.stage(data, digest=Digest(data)) as staged:
        assert staged.sha256 == hashlib.sha256(data).hexdigest()


def test_a_digest_whose_thread_failed_is_hashed_again_not_left_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = os.urandom(PARALLEL_HASH_BYTES)
    calls: list[int] = []
    sha256 = hashlib.sha256

    def once_failing(given: bytes) -> Any:
        calls.append(len(given))
        if len(calls) == 1:
            raise MemoryError("the first hash fails")
        return sha256(given)

    monkeypatch.setattr("spillbox.digest.hashlib.sha256", once_failing)
    monkeypatch.setattr("threading.excepthook", lambda args: None)  # the thread's own report
    assert Digest(data).hexdigest() == sha256(data).hexdigest()
    assert calls == [len(data), len(data)]


@pytest.mark.parametrize("name", ["../task-id", ".incoming", "missing.json", "", "a/b"])
def test_read_refuses_names_that_are_not_payloads(home: Path, name: str) -> None:
    storage = TaskStorage(home, "t1")
    storage.write("c1", "json", b"[]")
    with pytest.raises(StorageError):
        storage.read(name)


def test_read_refuses_symlinks(home: Path, tmp_path: Path) -> None:
    storage = TaskStorage(home, "t1")
    storage.ensure()
    secret = tmp_path / "secret"
    secret.write_text("secret")
    (storage.offload / "link.json").symlink_to(secret)
    with pytest.raises(StorageError):
        storage.read("link.json")
    assert storage.names() == []


def test_an_unwritable_home_is_a_storage_error(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    storage = TaskStorage(not_a_folder / "home", "t1")
    with pytest.raises(StorageError, match="SPILLBOX_HOME"):
        storage.ensure()
    with pytest.raises(StorageError):
        storage.write("c1", "json", b"[]")


def test_destroy_removes_everything_but_not_outside(home: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    storage = TaskStorage(home, "t1")
    storage.write("c1", "json", b"[]")
    (storage.work / "escape").symlink_to(outside)
    storage.destroy()
    assert not storage.root.exists()
    assert (outside / "keep").read_text() == "keep"
    assert stored_task_ids(home) == []


def test_task_ids_survive_as_written(home: Path) -> None:
    ids = ["t1", "../evil", "任务/一", "x" * 500, "a\rb\r\n", "lone \udc80 surrogate"]
    for task_id in ids:
        TaskStorage(home, task_id).ensure()
    assert sorted(stored_task_ids(home)) == sorted(ids)
