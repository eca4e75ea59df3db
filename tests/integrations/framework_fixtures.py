"""The fixtures of the framework integrations' Docker tests: the runtime, runc then gVisor,
and one harness per module and runtime. A test module loads them with
`pytest_plugins = ["framework_fixtures"]` (a second conftest.py would shadow the top one's
name, which tests import)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conftest import GVISOR, runtime_or_skip
from spillbox import Harness
from spillbox.sandbox.docker import SandboxOptions, cleanup_home


@pytest.fixture(scope="module", params=[None, GVISOR], ids=["runc", "gvisor"])
def runtime(request: pytest.FixtureRequest, docker_client: Any, sandbox_image: str) -> str | None:
    """The OCI runtime of a module's Docker tests: the engine's default, then gVisor, an
    optional mode (skipped where the engine has none). The sandbox image is built first."""
    return runtime_or_skip(docker_client, request.param)


@pytest.fixture(scope="module")
def docker_harness(
    runtime: str | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    """One harness (and home) for a module's Docker tests, per runtime, that collects
    nothing while they run; every container and folder of its home is removed after."""
    home = tmp_path_factory.mktemp("framework-home")
    options = SandboxOptions(runtime=runtime)
    try:
        with Harness(sandbox="docker", home=home, options=options, gc_interval=-1) as harness:
            yield harness
    finally:
        cleanup_home(home)
