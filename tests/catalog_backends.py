"""A real Postgres server for the catalog's tests, started by the test set-up itself.

One server per test session: initdb into a temporary folder, then pg_ctl start, listening
on a Unix socket in that folder only (no TCP port to collide with), stopped at the end.
PostgreSQL refuses to run as root, so as root it runs as the `postgres` user (runuser).
Each test gets a database of its own, dropped after. The binaries come from Debian's
postgresql package (scripts/ensure-postgres.sh, run by `make test`, installs it); without
them the Postgres tests fail under CI=true and skip elsewhere, as the Docker tests do.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from spillbox.catalog import Catalog

BACKENDS = ("sqlite", "postgres")


@dataclass(frozen=True)
class PostgresServer:
    socket_dir: Path

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]


def binaries_found() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    if found:
        return Path(found[0]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    binaries = binaries_found()
    if binaries is None:
        message = "PostgreSQL is not installed: run scripts/ensure-postgres.sh (make test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        with running_postgres(binaries) as server:
            yield server
    except PostgresDidNotStart as e:
        pytest.fail(str(e))


class PostgresDidNotStart(RuntimeError):
    pass


@contextmanager
def running_postgres(binaries: Path) -> Iterator[PostgresServer]:
    """A throwaway server in a temp folder (the tests' and the benchmarks')."""
    root = Path(tempfile.mkdtemp(prefix="spillbox-pg-"))
    root.chmod(0o755)
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    data, log = root / "data", root / "server.log"
    subprocess.run(
        _as_server_user(
            [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"]
            + ["--no-sync", "-E", "UTF8", "--locale=C"]
        ),
        check=True,
        capture_output=True,
    )
    options = (
        f"-c listen_addresses='' -c unix_socket_directories={root} -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    )
    pg_ctl = [str(binaries / "pg_ctl"), "-D", str(data)]
    started = subprocess.run(
        _as_server_user([*pg_ctl, "-l", str(log), "-o", options, "-w", "-t", "60", "start"]),
        capture_output=True,
        text=True,
    )
    if started.returncode != 0:
        said = log.read_text() if log.exists() else started.stderr
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresDidNotStart(f"PostgreSQL did not start: {said[-2000:]}")
    try:
        yield PostgresServer(root)
    finally:
        subprocess.run(
            _as_server_user([*pg_ctl, "-m", "immediate", "-w", "stop"]), capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database of the session's server, dropped after the test."""
    name = f"spillbox_{uuid.uuid4().hex[:12]}"
    postgres_server.admin(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.admin(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(params=BACKENDS)
def catalog_url(request: pytest.FixtureRequest) -> str | None:
    """The catalog's database: None (SQLite in the home) or a fresh Postgres database."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def catalog(home: Path, catalog_url: str | None) -> Iterator[Catalog]:
    """A Catalog in the test's home, on each backend catalog_url gives."""
    from spillbox.catalog import Catalog

    opened = Catalog(home, url=catalog_url)
    yield opened
    opened.close()


def run_at_once(commands: list[list[str]], timeout: float = 120) -> list[tuple[int, str, str]]:
    """Start every command, then release them together (each waits for a line on stdin
    before its work): exit status, stdout and stderr of each, in order."""
    procs = [
        subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = [proc.communicate(timeout=timeout) for proc in procs]
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]


ON_BOTH_DATABASES = ("test_retention", "test_retention_cli", "test_harness")
"""Test modules of the harness's behaviour that run twice: on SQLite, and on Postgres."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Property tests are left on SQLite: each example makes a home of its own, and all of
    # a test's examples would share its one Postgres database.
    if metafunc.module is None or hasattr(metafunc.function, "hypothesis"):
        return
    if Path(str(metafunc.module.__file__)).stem in ON_BOTH_DATABASES:
        metafunc.parametrize("harness_catalog", BACKENDS, indirect=True)


@pytest.fixture(autouse=True)
def harness_catalog(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """In the modules of ON_BOTH_DATABASES, a second run with every harness's catalog on a
    fresh Postgres database: the harnesses those tests make (some with environ={}, some
    through the CLI) get it as if configured, and their subprocesses through
    SPILLBOX_CATALOG_URL. Elsewhere, and in the first run, nothing changes (SQLite)."""
    if getattr(request, "param", "sqlite") == "sqlite":
        return None
    import spillbox.harness
    from spillbox.catalog import Catalog

    postgres: str = request.getfixturevalue("postgres_url")
    monkeypatch.setenv("SPILLBOX_CATALOG_URL", postgres)

    def configured(home: Path, url: str | None = None, **options: float) -> Catalog:
        return Catalog(home, url=url or postgres, **options)

    monkeypatch.setattr(spillbox.harness, "Catalog", configured)
    return postgres
