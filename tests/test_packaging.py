"""An installed wheel, not only a checkout, carries what spillbox needs at run time: the
sandbox image's files, so the image it builds is the same one, and the catalog's
migrations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from spillbox.sandbox.image import image_tag

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, spillbox
from spillbox.sandbox.image import image_tag, images_dir
import pathlib, tempfile
from spillbox.catalog import Catalog
runtime = images_dir() / "sandbox" / "runtime"
catalog = Catalog(pathlib.Path(tempfile.mkdtemp()))
catalog.task("t1")
print(json.dumps({"package": spillbox.__file__, "images": str(images_dir()),
                  "tag": image_tag(), "runtime": sorted(p.name for p in runtime.glob("*.py")),
                  "migrated": catalog.migrated}))
"""


def test_an_installed_wheel_builds_the_same_image_as_the_checkout(tmp_path: Path) -> None:
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources.
    source, wheels, target = tmp_path / "source", tmp_path / "wheels", tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".mypy_cache")
    for name in ("runtime", "sandbox_images"):
        shutil.copytree(REPO / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # No build isolation and no index: the test needs no network.
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
    )
    [wheel] = wheels.glob("spillbox-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    env = {k: v for k, v in os.environ.items() if k != "SPILLBOX_IMAGES_DIR"}
    env["PYTHONPATH"] = str(target)  # ahead of the checkout's editable install
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert Path(found["package"]).is_relative_to(target)
    assert Path(found["images"]) == target / "spillbox" / "sandbox_images"
    checkout = REPO / "sandbox_images" / "sandbox" / "runtime"
    assert found["runtime"] == sorted(p.name for p in checkout.glob("*.py"))
    assert found["tag"] == image_tag()
    assert found["migrated"]  # the migrations ship in the wheel, and ran
