"""What starting costs: `import spillbox` and the command line import the heavy modules (the
catalog's SQLAlchemy and Alembic, Docker, DuckDB, the SDKs, tiktoken) only when a name or a
command that needs them is used."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import spillbox

HEAVY = ("sqlalchemy", "alembic", "docker", "duckdb", "mcp", "openai", "anthropic", "hyperscan")


def modules_after(code: str) -> set[str]:
    """The top-level modules a fresh interpreter has loaded after running code."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return {name.partition(".")[0] for name in json.loads(done.stdout.splitlines()[-1])}


def test_import_spillbox_loads_none_of_the_heavy_modules() -> None:
    loaded = modules_after("import spillbox")
    assert loaded.isdisjoint((*HEAVY, "tiktoken")), sorted(loaded.intersection(HEAVY))


def test_the_command_lines_version_loads_none_of_them() -> None:
    loaded = modules_after(
        "import sys\nfrom spillbox import cli\nsys.argv = ['spillbox', '--version']\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass"
    )
    assert loaded.isdisjoint((*HEAVY, "tiktoken")), sorted(loaded.intersection(HEAVY))


@pytest.mark.parametrize("name", spillbox.__all__)
def test_every_public_name_is_the_object_its_module_defines(name: str) -> None:
    module, attribute = spillbox._EXPORTS[name]
    assert getattr(spillbox, name) is getattr(importlib.import_module(module), attribute)


def test_the_lazy_table_and_all_agree() -> None:
    assert sorted(spillbox._EXPORTS) == sorted(spillbox.__all__)
    assert set(spillbox.__all__) <= set(dir(spillbox))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        spillbox.nope  # noqa: B018
