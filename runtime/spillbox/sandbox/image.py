"""The sandbox image: named by a hash of its files, built from them with or without a registry.

Users with a container registry get the ordinary ``FROM python:3.11-slim`` build. Machines with
no registry get a Debian base made with mmdebstrap and imported into Docker, and the image is
then built with no network. Either way duckdb, pyarrow and jq come from wheels fetched on the host
with pip, so nothing inside the build talks to a package index; and the jq CLI is built in a
stage of its own from jq's release source, fetched on the host and checked against its pinned
sha256, so the final image carries no compiler.

The build reports its steps as BuildEvents (a step starts, prints a line, is done); the build
and venv stages run side by side, so two steps may be running at once.

>>> import docker
>>> from spillbox.sandbox.image import ensure_image
>>> tag = ensure_image(docker.from_env(), progress=print)  # doctest: +SKIP
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import platform
import queue
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import docker

from spillbox.errors import ConfigError, SandboxError
from spillbox.sandbox.docker_errors import DOCKER_FAILURES, detail, translated, unless_gone

IMAGE_REPOSITORY = "spillbox-sandbox"
BASE_REPOSITORY = "spillbox-base"
IMAGE_LABEL = "spillbox.image"
REGISTRY_BASE = "python:3.11-slim"
DEBIAN_SUITE = "bookworm"
"""Its python3 is 3.11, which the cp311 wheels need."""
DEBIAN_PACKAGES = ("python3", "python3-venv", "tini", "procps")
"""The offline base's packages (mmdebstrap's minbase variant has the rest)."""
BUILD_PACKAGES = ("gcc", "make", "libc6-dev")
"""The build stage's compiler, never in the image: offline, their .debs are downloaded with the
base (same mirror, same moment) and installed in the build stage with dpkg."""
JQ_SDIST_URL = (
    "https://files.pythonhosted.org/packages/67/67/"
    "bd53dc762c2e7728b7b32bdbe59ecb74ae6bc6b7609e5063e6e44553b44f/jq-1.13.0.tar.gz"
)
JQ_SDIST_SHA256 = "e62bdddeab3b8a0a404581a7bb6f1e8c4cc6082280870031f746074f4cac52c0"
JQ_SOURCE_MEMBER = "jq-1.13.0/deps/jq-1.8.2.tar.gz"
"""jq 1.8.2's official release tarball, as the sdist of the jq Python package (the version
requirements.txt pins) carries it: PyPI answers where GitHub, jq's own home, may not. Debian
bookworm's jq 1.6 takes 20-40 ms to start (it compiles its builtins each time); 1.8.2 about 2
ms. The Dockerfile checks the tarball's own sha256 again, so a new jq is a new image tag."""
JQ_SOURCE_NAME = "jq-src.tar.gz"
"""Its name in the build context."""
PULL_STALL_SECONDS = 15.0
"""In "auto", a pull that reports nothing for this long counts as no registry (a blackholed
registry otherwise holds the pull for 25 s or more before the engine gives up)."""

SCRATCH_MIN_FREE = 2 << 30
"""The least free space of /dev/shm for mmdebstrap to unpack the base there (about 600 MB at its
peak): a tmpfs spares it the disk's fsyncs, which on a busy machine take most of its time."""

BaseKind = Literal["auto", "registry", "debootstrap"]
EventKind = Literal["start", "output", "done"]


@dataclass(frozen=True)
class BuildEvent:
    """What the image build reports: a step starts (text: what it does), prints a line of its
    output, or is done (text: what it made or found). A step whose work was already done (in
    the cache, already built) is reported done only."""

    step: str
    """Its name: "wheels", "jq source", "registry", "base", "stage build", "stage venv",
    "image" or "prune"."""
    kind: EventKind
    text: str


Progress = Callable[[BuildEvent], None]
Lines = Callable[[str], None]

_HASH_CHARS = 16
_IGNORED_NAMES = frozenset({"__pycache__"})
_DEBS_DIR = "/var/cache/spillbox-build-debs"
"""Where the build packages' .debs are downloaded inside the base tree, then moved out."""
_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
# docker import gives an image with no config; these make it behave like a Debian image.
_IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
)
_OFFLINE_HINT = "or make python:3.11-slim available and build with base='registry'"


def images_dir() -> Path:
    """The sandbox_images/ folder: $SPILLBOX_IMAGES_DIR; else the copy an installed wheel
    carries (spillbox/sandbox_images); else, in a checkout, the one beside runtime/."""
    configured = os.environ.get("SPILLBOX_IMAGES_DIR")
    package = Path(__file__).resolve().parents[1]
    if configured:
        path = Path(configured)
    elif (package / "sandbox_images").is_dir():
        path = package / "sandbox_images"
    else:
        path = package.parents[1] / "sandbox_images"
    if not (path / "sandbox" / "Dockerfile").is_file():
        raise ConfigError(
            f"sandbox image files not found in {path}: "
            "set SPILLBOX_IMAGES_DIR to the project's sandbox_images folder"
        )
    return path


def image_tag() -> str:
    """The tag of the image built from the current files; any change to them changes it."""
    return _tag(_content_hash(images_dir()))


def image_present(client: docker.DockerClient) -> bool:
    """Whether the image for the current files is already built."""
    return _image_exists(client, image_tag())


def default_cache_dir() -> Path:
    """Where image builds keep their downloads and their lock: ~/.cache/spillbox."""
    return Path.home() / ".cache" / "spillbox"


def ensure_image(client: docker.DockerClient, *, progress: Progress | None = None) -> str:
    """The image tag for the current files, building the image first if it is missing."""
    tag = image_tag()
    if _image_exists(client, tag):
        return tag
    # Processes that start on a new machine together (test workers, several harnesses)
    # build it once: the others wait, then find it built.
    cache = default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if _image_exists(client, tag):
            return tag
        return build_image(client, progress=progress, cache_dir=cache)


def image_size(client: docker.DockerClient, tag: str) -> int:
    """The size of an image in bytes, as Docker counts it (all its layers)."""
    with _docker_errors(f"looking up image {tag}", "check that Docker is running"):
        size: int = client.images.get(tag).attrs["Size"]
    return size


def build_image(
    client: docker.DockerClient,
    *,
    base: BaseKind = "auto",
    progress: Progress | None = None,
    cache_dir: Path | None = None,
) -> str:
    """Build the sandbox image and return its tag.

    base: "registry" builds FROM python:3.11-slim (pulled if missing); "debootstrap" builds from
    a local Debian base made with mmdebstrap, with no network (needs root); "auto" uses the
    registry when python:3.11-slim is present or pulls without stalling, else "debootstrap".
    cache_dir keeps the downloads across builds (default ~/.cache/spillbox).
    """
    report = progress or _discard
    root = images_dir()
    content_hash = _content_hash(root)
    tag = _tag(content_hash)
    cache = cache_dir or default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    wheels = _fetch_wheels(root / "sandbox" / "requirements.txt", cache, report)
    jq_source = _fetch_jq_source(cache, report)

    base_image, network_mode, debs = _base_image(client, base, cache, report)
    with tempfile.TemporaryDirectory(prefix="build-", dir=cache) as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(root / "sandbox", context, ignore=shutil.ignore_patterns(*_IGNORED_NAMES))
        # Hard links: the wheels are tens of MB and the context lives on the same filesystem.
        shutil.copytree(wheels, context / "wheels", copy_function=os.link)
        os.link(jq_source, context / JQ_SOURCE_NAME)
        (context / "debs").mkdir()
        for deb in debs.iterdir() if debs else ():
            os.link(deb, context / "debs" / deb.name)
        build = partial(
            _docker_build, client, context, {"BASE": base_image}, network_mode, base_image
        )
        _build_stages(build, context, report)
        step = _Step(report, "image", f"building {tag} from {base_image}")
        build(
            step,
            "Dockerfile",
            tag=tag,
            labels={IMAGE_LABEL: "1", "spillbox.content-hash": content_hash},
        )
    prune_outdated(client, tag, report)
    return tag


def _base_image(
    client: docker.DockerClient, base: BaseKind, cache: Path, progress: Progress
) -> tuple[str, str | None, Path | None]:
    """The image to build FROM, the build's network mode (None: the default network) and the
    folder of the build stage's .debs (None: it installs them with apt-get)."""
    if base == "auto":
        usable = _registry_base_usable(client, REGISTRY_BASE, progress)
        base = "registry" if usable else "debootstrap"
    if base == "registry":
        # Its build stage installs BUILD_PACKAGES with apt-get: the build has the network.
        return REGISTRY_BASE, None, None
    base_image, debs = _debian_base(client, cache, progress)
    return base_image, "none", debs


def _build_stages(build: Callable[..., None], context: Path, progress: Progress) -> None:
    """Build the Dockerfile's stages side by side, each as a build of its own: the legacy
    builder (docker-py has no BuildKit) runs a file's stages one after the other, and built
    apart they are in the cache for the whole file's build."""
    stages = _stage_dockerfiles((context / "Dockerfile").read_text())
    with ThreadPoolExecutor(max_workers=len(stages)) as pool:
        futures = []
        for name, text in stages.items():
            (context / f"Dockerfile.{name}").write_text(text)
            step = _Step(progress, f"stage {name}", f"building the {name} stage")
            futures.append(pool.submit(build, step, f"Dockerfile.{name}"))
        for future in futures:
            future.result()


def prune_outdated(client: docker.DockerClient, keep: str, progress: Progress) -> None:
    """Remove the sandbox images of earlier file versions that no container uses.

    Each upgrade builds a new image of about 450 MB; the old ones would stay forever. An image
    a container still uses (a task of another spillbox version) is kept: Docker refuses.
    """
    with _docker_errors("listing outdated sandbox images", "check that Docker is running"):
        images = client.images.list(filters={"label": f"{IMAGE_LABEL}=1"})
    for image in images:
        if keep in image.tags:
            continue
        for ref in image.tags or [image.id]:
            try:
                client.images.remove(ref)
            except DOCKER_FAILURES:
                continue  # in use, or removed meanwhile by another process
            progress(BuildEvent("prune", "done", f"removed outdated image {ref}"))


class _Step:
    """One step of the build, as events: started when made, then lines of output, then done."""

    def __init__(self, progress: Progress, step: str, text: str) -> None:
        self._progress = progress
        self.step = step
        progress(BuildEvent(step, "start", text))

    def output(self, line: str) -> None:
        self._progress(BuildEvent(self.step, "output", line))

    def done(self, text: str) -> None:
        self._progress(BuildEvent(self.step, "done", text))


def _docker_build(
    client: docker.DockerClient,
    context: Path,
    buildargs: dict[str, str],
    network_mode: str | None,
    base_image: str,
    step: _Step,
    dockerfile: str,
    *,
    tag: str | None = None,
    labels: dict[str, str] | None = None,
) -> None:
    """One docker build of the context, its output lines reported as the step's."""
    with _docker_errors("building the sandbox image", "check that Docker has disk space"):
        stream = client.api.build(
            path=str(context),
            dockerfile=dockerfile,
            tag=tag,
            buildargs=buildargs,
            labels=labels,
            network_mode=network_mode,
            rm=True,
            forcerm=True,
            decode=True,
        )
        output = ""
        for event in stream:
            if "error" in event:
                raise SandboxError(
                    f"building the sandbox image from {base_image} failed: "
                    f"{_one_line(str(event['error']))} (last output: {output or 'none'}); "
                    "try the other base (base='registry' or base='debootstrap')"
                )
            for line in _event_lines(event):
                output = line
                step.output(line)
    step.done(tag or dockerfile.removeprefix("Dockerfile.") + " stage")


def _stage_dockerfiles(dockerfile: str) -> dict[str, str]:
    """Each named stage of a Dockerfile as a Dockerfile of its own: the global ARGs (the lines
    before the first FROM), then the stage's lines. The named stages take nothing from one
    another (no COPY --from), so they can be built in any order, side by side."""
    lines = dockerfile.splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines) if line.split()[:1] in (["FROM"], ["from"])]
    header = "".join(lines[: starts[0]])
    stages = {}
    for first, after in zip(starts, [*starts[1:], len(lines)], strict=True):
        words = lines[first].split()
        if len(words) == 4 and words[2].lower() == "as":
            stages[words[3]] = header + "".join(lines[first:after])
    return stages


def _tag(content_hash: str) -> str:
    return f"{IMAGE_REPOSITORY}:{content_hash}"


def _content_hash(root: Path) -> str:
    """A sha256 over the sorted relative paths, executable bits and bytes of the files."""
    files = {
        path.relative_to(root).as_posix(): path
        for path in root.rglob("*")
        if path.is_file() and _IGNORED_NAMES.isdisjoint(path.relative_to(root).parts)
    }
    digest = hashlib.sha256()
    for name in sorted(files):
        data = files[name].read_bytes()
        executable = files[name].stat().st_mode & 0o111 != 0
        # Length-prefixed fields, so no two different trees hash the same byte stream.
        for field in (name.encode(), b"x" if executable else b"-", data):
            digest.update(len(field).to_bytes(8, "big"))
            digest.update(field)
    return digest.hexdigest()[:_HASH_CHARS]


def _arch() -> str:
    machine = platform.machine().lower()
    if machine not in _ARCHES:
        raise ConfigError(
            f"unsupported machine architecture {machine!r}: "
            "the sandbox image is built for x86_64 or aarch64 only"
        )
    return _ARCHES[machine]


def _in_cache(progress: Progress, step: str, found: bool, what: Callable[[], str]) -> bool:
    """Whether a download's cached copy was found (the step then done: what(), in the
    cache)."""
    if found:
        progress(BuildEvent(step, "done", f"{what()}, in the cache"))
    return found


def _fetch_wheels(requirements: Path, cache: Path, progress: Progress) -> Path:
    """The folder of cp311 manylinux wheels for requirements, downloaded once per pin set."""
    platform_tag = f"manylinux_2_28_{_arch()}"
    pins = hashlib.sha256(requirements.read_bytes()).hexdigest()[:_HASH_CHARS]
    wheels = cache / "wheels" / f"cp311-{platform_tag}-{pins}"
    if _in_cache(progress, "wheels", wheels.is_dir(), lambda: f"{_count(wheels)} wheels"):
        return wheels
    wheels.parent.mkdir(parents=True, exist_ok=True)
    step = _Step(progress, "wheels", f"downloading the wheels of {requirements.name}")
    download = Path(tempfile.mkdtemp(prefix="download-", dir=wheels.parent))
    try:
        _run(
            [
                *(sys.executable, "-m", "pip", "download", "--disable-pip-version-check"),
                *("--progress-bar", "off", "--only-binary", ":all:"),
                *("--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"),
                # The older manylinux tag too: pip takes only the tags it is given, and
                # some wheels (matplotlib's) are built for manylinux2014 alone.
                *("--platform", platform_tag, "--platform", f"manylinux_2_17_{_arch()}"),
                *("-r", str(requirements), "-d", str(download)),
            ],
            what="pip download of the sandbox wheels",
            hint="check access to the package index (pip config), then retry",
            report=step.output,
        )
        # The folder appears complete at once, so an interrupted download is never reused.
        download.rename(wheels)
    except OSError:
        if not wheels.is_dir():  # else a concurrent build finished the same download first
            raise
    finally:
        shutil.rmtree(download, ignore_errors=True)
    step.done(f"{_count(wheels)} wheels, {_megabytes(wheels)} ({platform_tag})")
    return wheels


def _fetch_jq_source(cache: Path, progress: Progress) -> Path:
    """jq's release tarball (JQ_SOURCE_MEMBER), taken once from the pinned sdist after
    checking the sdist's sha256, and kept in the cache."""
    target = cache / "sources" / f"{JQ_SDIST_SHA256[:_HASH_CHARS]}-{Path(JQ_SOURCE_MEMBER).name}"
    if _in_cache(progress, "jq source", target.is_file(), lambda: target.name):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    step = _Step(progress, "jq source", f"downloading {JQ_SDIST_URL.rsplit('/', 1)[-1]}")
    hint = "check access to files.pythonhosted.org, then retry"
    try:
        with urllib.request.urlopen(JQ_SDIST_URL, timeout=60) as response:
            sdist = response.read()
    except OSError as exc:  # urllib's URLError and HTTPError are OSErrors
        raise SandboxError(f"downloading jq's source failed ({exc}); {hint}") from exc
    digest = hashlib.sha256(sdist).hexdigest()
    if digest != JQ_SDIST_SHA256:
        raise SandboxError(
            f"jq's source from {JQ_SDIST_URL} has sha256 {digest}, not the pinned "
            f"{JQ_SDIST_SHA256}: it was not used; {hint}"
        )
    with tarfile.open(fileobj=io.BytesIO(sdist)) as archive:
        member = archive.extractfile(JQ_SOURCE_MEMBER)
        if member is None:
            raise SandboxError(f"the jq sdist holds no file {JQ_SOURCE_MEMBER}")
        data = member.read()
    # Complete at once under its name, so an interrupted write is never reused.
    fd, name = tempfile.mkstemp(prefix="download-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as written:
            written.write(data)
        os.rename(name, target)
    finally:
        Path(name).unlink(missing_ok=True)
    step.done(f"{target.name}, {_megabytes(target)}, sha256 checked")
    return target


def _registry_base_usable(
    client: docker.DockerClient,
    image: str,
    progress: Progress,
    stall_seconds: float = PULL_STALL_SECONDS,
) -> bool:
    """Whether image is present or can be pulled; a pull that stalls counts as no registry.

    The engine's pull has no timeout of its own, so it runs in a daemon thread that is left
    behind (and ends when the engine gives up) if it stalls.
    """
    if _image_exists(client, image):
        progress(BuildEvent("registry", "done", f"{image}, already pulled"))
        return True
    step = _Step(progress, "registry", f"pulling {image}")
    events: queue.Queue[Mapping[str, Any] | Exception | None] = queue.Queue()

    def pull() -> None:
        try:
            for event in client.api.pull(image, stream=True, decode=True):
                events.put(event)
        except Exception as exc:  # handed to the waiting thread, which decides
            events.put(exc)
        else:
            events.put(None)

    threading.Thread(target=pull, name=f"spillbox-pull-{image}", daemon=True).start()
    while True:
        try:
            event = events.get(timeout=stall_seconds)
        except queue.Empty:
            step.done(f"no registry: pulling {image} stalled for {stall_seconds:.0f} s")
            return False
        if event is None:
            step.done(f"{image}, pulled")
            return True
        if isinstance(event, Exception) or "error" in event:
            reason = detail(event) if isinstance(event, Exception) else str(event["error"])
            step.done(f"no registry: pulling {image} failed: {_one_line(reason)}")
            return False
        for line in _event_lines(event):
            step.output(line)


def _debian_base(client: docker.DockerClient, cache: Path, progress: Progress) -> tuple[str, Path]:
    """A local Debian base image with DEBIAN_PACKAGES, made with mmdebstrap, and the folder of
    BUILD_PACKAGES' .debs (with what they need beyond the base), made with it; both reused
    while their inputs are unchanged. One base serves the build stages and the image."""
    inputs = json.dumps(
        [DEBIAN_SUITE, "minbase", DEBIAN_PACKAGES, BUILD_PACKAGES, _arch(), _IMPORT_CHANGES]
    ).encode()
    tag_name = hashlib.sha256(inputs).hexdigest()[:_HASH_CHARS]
    base = f"{BASE_REPOSITORY}:{tag_name}"
    debs = cache / "debs" / tag_name
    if _image_exists(client, base) and debs.is_dir():
        progress(BuildEvent("base", "done", f"{base}, already built"))
        return base, debs
    mmdebstrap = _mmdebstrap_command(progress)
    mirror = _apt_mirror()
    step = _Step(
        progress,
        "base",
        f"mmdebstrap {DEBIAN_SUITE} ({', '.join(DEBIAN_PACKAGES)}; the .debs of "
        f"{', '.join(BUILD_PACKAGES)}) from {mirror or 'the default Debian mirror'}",
    )
    debs.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="base-", dir=cache) as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        downloaded = Path(tmp) / "debs"
        downloaded.mkdir()
        _mmdebstrap(mmdebstrap, mirror, tarball, downloaded, cache, step)
        step.output(f"importing {base}")
        with _docker_errors("docker import of the sandbox base", "check Docker's free disk space"):
            client.api.import_image_from_file(
                str(tarball),
                repository=BASE_REPOSITORY,
                tag=tag_name,
                changes=list(_IMPORT_CHANGES),
            )
        shutil.rmtree(debs, ignore_errors=True)  # an older download, of a base since removed
        try:
            downloaded.rename(debs)  # complete at once: a partial folder is never reused
        except OSError:
            if not debs.is_dir():  # else a concurrent build made the same folder first
                raise
    step.done(f"{base}, {_megabytes_of(image_size(client, base))}; {_count(debs)} build .debs")
    return base, debs


def _mmdebstrap(
    command: str, mirror: str | None, tarball: Path, debs: Path, cache: Path, step: _Step
) -> None:
    """Make the base's root tree as tarball, and BUILD_PACKAGES' .debs in debs."""
    # Hooks run on the host with the tree as $1, before mmdebstrap empties apt's lists and
    # caches; the .debs are moved out, so the base does not carry them.
    hooks = (
        f'mkdir -p "$1{_DEBS_DIR}/partial"',
        f'chroot "$1" apt-get install --download-only --yes --no-install-recommends '
        f"-o Dir::Cache::Archives={_DEBS_DIR}/ {' '.join(BUILD_PACKAGES)}",
        f'mv "$1{_DEBS_DIR}"/*.deb {shlex.quote(str(debs))}/ && rm -rf "$1{_DEBS_DIR}"',
    )
    _run(
        [
            *(command, "--variant=minbase", "--mode=root", "--dpkgopt=force-unsafe-io"),
            f"--include={','.join(DEBIAN_PACKAGES)}",
            *(f"--customize-hook={hook}" for hook in hooks),
            *(DEBIAN_SUITE, str(tarball), *([mirror] if mirror else [])),
        ],
        what="mmdebstrap of the sandbox base",
        hint=f"check access to the Debian mirror in the apt sources, {_OFFLINE_HINT}",
        report=step.output,
        env={**os.environ, "TMPDIR": str(_scratch_dir(cache))},
    )


def _scratch_dir(cache: Path) -> Path:
    """Where mmdebstrap unpacks the base: /dev/shm where it is a large enough tmpfs that allows
    executables (mmdebstrap runs the tree's own dpkg), else the cache on disk."""
    shm = Path("/dev/shm")
    try:
        stats = os.statvfs(shm)
    except OSError:
        return cache
    roomy = stats.f_bavail * stats.f_frsize >= SCRATCH_MIN_FREE
    if roomy and not stats.f_flag & os.ST_NOEXEC and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return cache


def _mmdebstrap_command(progress: Progress) -> str:
    """The mmdebstrap executable, installed with apt-get if missing (both need root)."""
    if os.geteuid() != 0:
        raise ConfigError(
            "building the sandbox image without a registry runs mmdebstrap, which needs root: "
            f"run as root, {_OFFLINE_HINT}"
        )
    found = shutil.which("mmdebstrap")
    if found:
        return found
    if not shutil.which("apt-get"):
        raise ConfigError(
            "mmdebstrap is not installed and there is no apt-get to install it: "
            f"install mmdebstrap, {_OFFLINE_HINT}"
        )
    step = _Step(progress, "mmdebstrap", "installing mmdebstrap with apt-get")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", "mmdebstrap"],
    ):
        _run(
            command,
            what=" ".join(command),
            hint=f"install mmdebstrap by hand, {_OFFLINE_HINT}",
            report=step.output,
            env=environment,
        )
    installed = shutil.which("mmdebstrap")
    if not installed:
        raise ConfigError(f"apt-get installed mmdebstrap but it was not found: {_OFFLINE_HINT}")
    step.done(installed)
    return installed


def _apt_mirror() -> str | None:
    """The host's Debian mirror from its apt sources; None lets mmdebstrap use its default.

    Prefers an entry for DEBIAN_SUITE, then any Debian archive (URI ending in /debian), so an
    Ubuntu host's mirror is never used for Debian.
    """
    apt = Path("/etc/apt")
    entries: list[tuple[str, list[str]]] = []
    for path in sorted(apt.glob("sources.list.d/*.sources")):
        entries += _deb822_entries(path.read_text(errors="replace"))
    for path in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        if path.is_file():
            entries += _one_line_entries(path.read_text(errors="replace"))
    for uri, suites in entries:
        if DEBIAN_SUITE in suites:
            return uri
    return next((uri for uri, _ in entries if uri.rstrip("/").endswith("/debian")), None)


def _deb822_entries(text: str) -> list[tuple[str, list[str]]]:
    """(URI, suites) of the enabled "deb" stanzas of a deb822 .sources file."""
    entries: list[tuple[str, list[str]]] = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
            suites = fields.get("suites", "").split()
            entries += [(uri, suites) for uri in fields.get("uris", "").split()]
    return entries


def _one_line_entries(text: str) -> list[tuple[str, list[str]]]:
    """(URI, [suite]) of the "deb" lines of a one-line-style sources.list."""
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            entries.append((words[0], [words[1]]))
    return entries


def _run(
    command: Sequence[str],
    *,
    what: str,
    hint: str,
    report: Lines,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run a host command, streaming its output lines to report; failures become SandboxError."""
    last = ""
    try:
        with subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
        ) as process:
            assert process.stdout is not None  # stdout=PIPE
            for raw in process.stdout:
                line = raw.rstrip()
                if line:
                    last = line
                    report(line)
    except OSError as exc:
        raise SandboxError(f"{what} could not start ({exc.strerror}): {hint}") from exc
    if process.returncode != 0:
        raise SandboxError(f"{what} failed (exit {process.returncode}: {last}); {hint}")


def _docker_errors(what: str, hint: str) -> AbstractContextManager[None]:
    """The image builder's wording of a Docker failure (docker_errors.py's table):
    "<what> failed: <detail>; <hint>", on one line."""
    return translated(lambda said: f"{what} failed: {_one_line(said)}; {hint}")


def _image_exists(client: docker.DockerClient, image: str) -> bool:
    with _docker_errors(f"looking up image {image}", "check that Docker is running"):
        return unless_gone(partial(client.images.get, image), None) is not None


def _event_lines(event: Mapping[str, Any]) -> list[str]:
    """The readable lines of a build or pull event; none for byte-count progress ticks."""
    if event.get("progressDetail"):
        return []
    if "stream" in event:
        return [line.strip() for line in str(event["stream"]).splitlines() if line.strip()]
    if "status" in event:
        return [" ".join(str(event[key]) for key in ("status", "id") if key in event)]
    return []


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _count(folder: Path) -> int:
    return sum(1 for _ in folder.iterdir())


def _megabytes(path: Path) -> str:
    files = [path] if path.is_file() else [item for item in path.rglob("*") if item.is_file()]
    return _megabytes_of(sum(item.stat().st_size for item in files))


def _megabytes_of(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e6:.1f} MB"


def _discard(_event: BuildEvent) -> None:
    """The progress callback when the caller gives none."""
