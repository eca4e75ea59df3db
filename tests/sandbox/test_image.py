"""The sandbox image: its tag follows its files, and it runs hardened with what code mode needs."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import socket
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.models.containers import Container

from spillbox.errors import ConfigError, SandboxError
from spillbox.sandbox import image

RUN_LABEL = "spillbox.test.run"


@pytest.fixture
def images_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of sandbox_images/ that image_tag() reads instead of the real one."""
    copy = tmp_path / "sandbox_images"
    shutil.copytree(image.images_dir(), copy)
    monkeypatch.setenv("SPILLBOX_IMAGES_DIR", str(copy))
    return copy


def test_tag_is_the_repository_and_16_hex(images_copy: Path) -> None:
    assert re.fullmatch(r"spillbox-sandbox:[0-9a-f]{16}", image.image_tag())
    assert image.image_tag() == image.image_tag()


def test_tag_changes_when_an_image_file_changes(images_copy: Path) -> None:
    before = image.image_tag()
    dockerfile = images_copy / "sandbox" / "Dockerfile"
    dockerfile.write_bytes(dockerfile.read_bytes() + b"\n")
    edited = image.image_tag()
    (images_copy / "sandbox" / "runtime" / "new.sh").write_text("true\n")
    added = image.image_tag()
    assert len({before, edited, added}) == 3


def test_tag_ignores_python_caches(images_copy: Path) -> None:
    before = image.image_tag()
    cache = images_copy / "sandbox" / "runtime" / "__pycache__"
    cache.mkdir(exist_ok=True)  # there already where the runtime's modules were imported
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    assert image.image_tag() == before


def test_missing_images_dir_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPILLBOX_IMAGES_DIR", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="SPILLBOX_IMAGES_DIR"):
        image.image_tag()


def test_the_named_stages_split_into_dockerfiles_of_their_own() -> None:
    dockerfile = (image.images_dir() / "sandbox" / "Dockerfile").read_text()
    stages = image._stage_dockerfiles(dockerfile)
    assert sorted(stages) == ["build", "venv"]
    header = dockerfile[: dockerfile.index("\nFROM ") + 1]
    for name, text in stages.items():
        assert text.startswith(header)  # the global ARGs: FROM ${BASE} needs them
        froms = [line for line in text.splitlines() if line.startswith("FROM ")]
        assert froms == [f"FROM ${{BASE}} AS {name}"]
        assert "--from=" not in text  # built side by side: no stage takes from another
        assert text[len(header) :] in dockerfile


def _sdist(member: str, data: bytes) -> bytes:
    """A tar.gz holding one file, as the jq sdist holds jq's release tarball."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo(member)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_jq_source_is_taken_from_the_checked_sdist_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdist = _sdist(image.JQ_SOURCE_MEMBER, b"jq source")
    downloads: list[str] = []

    def urlopen(url: str, timeout: float) -> io.BytesIO:
        downloads.append(url)
        return io.BytesIO(sdist)

    monkeypatch.setattr(image.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(image, "JQ_SDIST_SHA256", hashlib.sha256(sdist).hexdigest())
    first = image._fetch_jq_source(tmp_path, print)
    assert first.read_bytes() == b"jq source"
    assert image._fetch_jq_source(tmp_path, print) == first
    assert downloads == [image.JQ_SDIST_URL]  # the second came from the cache


def test_a_jq_sdist_with_another_sha256_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tampered = _sdist(image.JQ_SOURCE_MEMBER, b"something else")
    monkeypatch.setattr(image.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(tampered))
    with pytest.raises(SandboxError, match="not the pinned"):
        image._fetch_jq_source(tmp_path, print)
    assert not any((tmp_path / "sources").iterdir())  # nothing kept


@pytest.fixture(scope="module")
def container(docker_client: docker.DockerClient, sandbox_image: str) -> Iterator[Container]:
    """One container of the image, run as hardened as the sandbox runs it."""
    labels = {"spillbox.test": "1", RUN_LABEL: uuid.uuid4().hex}
    try:
        yield docker_client.containers.run(
            sandbox_image,
            detach=True,
            network_mode="none",
            read_only=True,
            user="10001",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            labels=labels,
        )
    finally:
        selector = [f"{key}={value}" for key, value in labels.items()]
        for leftover in docker_client.containers.list(all=True, filters={"label": selector}):
            leftover.remove(force=True)


def run(container: Container, *command: str) -> str:
    exit_code, output = container.exec_run(list(command))
    text: str = output.decode()
    assert exit_code == 0, text
    return text.strip()


@pytest.mark.docker
def test_image_is_labelled_with_its_content_hash(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    labels = docker_client.images.get(sandbox_image).labels
    assert labels["spillbox.image"] == "1"
    assert labels["spillbox.content-hash"] == sandbox_image.split(":")[1]


@pytest.mark.docker
def test_python_imports_duckdb_pyarrow_and_jq(container: Container) -> None:
    script = "import duckdb, pyarrow, jq; print(duckdb.sql('select 42').fetchall()[0][0])"
    assert run(container, "python3", "-c", script) == "42"


@pytest.mark.docker
def test_jq_cli_and_process_tools_exist(container: Container) -> None:
    assert run(container, "jq", "--version") == "jq-1.8.2"  # built in the image: a fast start
    assert run(container, "pkill", "--version").startswith("pkill")


@pytest.mark.docker
def test_the_image_carries_no_compiler(container: Container) -> None:
    """jq is compiled in a build stage of its own; the image takes only its binary."""
    found = run(container, "sh", "-c", "command -v gcc cc make ld as || true")
    assert found == ""


@pytest.mark.docker
def test_runs_as_the_sandbox_user_under_tini(container: Container) -> None:
    assert run(container, "id", "-u") == "10001"
    assert run(container, "id", "-u", "spillsql") == "10002"
    assert run(container, "ps", "-o", "comm=", "-p", "1") == "tini"


@pytest.mark.docker
def test_folders_belong_to_their_users(container: Container) -> None:
    owners = run(container, "stat", "-c", "%n %u", "/sandbox/work", "/sandbox/cache")
    assert owners.splitlines() == ["/sandbox/work 10001", "/sandbox/cache 10002"]
    assert run(container, "find", "/opt/spillbox", "-perm", "/222") == ""


@pytest.mark.docker
def test_a_stalled_pull_does_not_hang_auto(docker_client: docker.DockerClient) -> None:
    # A "registry" that never answers: the kernel completes the handshakes of a listening
    # socket nobody accepts on, so the engine waits as it would on a blackholed registry.
    server = socket.create_server(("127.0.0.1", 0))
    reference = f"127.0.0.1:{server.getsockname()[1]}/python:3.11-slim"
    events: list[image.BuildEvent] = []
    started = time.monotonic()
    try:
        usable = image._registry_base_usable(
            docker_client, reference, events.append, stall_seconds=1.0
        )
    finally:
        server.close()
    assert not usable
    # A guard against a hang (an unbounded wait), not a speed claim: 1 s stall, 30 s bound.
    assert time.monotonic() - started < 30
    assert events[-1].step == "registry"
    assert events[-1].kind == "done"
    assert events[-1].text.startswith("no registry: pulling")


@pytest.mark.docker
def test_pruning_removes_outdated_images_that_no_container_uses(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    # Two "earlier versions": distinct images that carry the sandbox label, built locally.
    outdated = []
    for n in range(2):
        tag = f"{image.IMAGE_REPOSITORY}:test-outdated-{uuid.uuid4().hex[:8]}"
        context = io.BytesIO(f"FROM {sandbox_image}\nLABEL spillbox.test-outdated={n}\n".encode())
        docker_client.images.build(fileobj=context, tag=tag, rm=True)
        outdated.append(tag)
    in_use = docker_client.containers.create(outdated[1], labels={"spillbox.test": "1"})
    events: list[image.BuildEvent] = []
    try:
        image.prune_outdated(docker_client, sandbox_image, events.append)
        assert not image._image_exists(docker_client, outdated[0])
        assert image._image_exists(docker_client, outdated[1])  # a container still uses it
        assert image._image_exists(docker_client, sandbox_image)
        assert image.BuildEvent("prune", "done", f"removed outdated image {outdated[0]}") in events
    finally:
        in_use.remove(force=True)
    image.prune_outdated(docker_client, sandbox_image, events.append)
    assert not image._image_exists(docker_client, outdated[1])
