"""Files and charts come back (issue 13, item 3), against a real engine: what a script or a
session cell leaves in /sandbox/outputs becomes artifacts, and its PNG/JPEG files and open
matplotlib figures come back as images. The attacks on this way out are in test_outputs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spillbox import Harness, Task
from spillbox.codemode import MAX_IMAGES
from spillbox.tools import Toolset

pytestmark = pytest.mark.docker

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT = "import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.title('t')\n"


@pytest.fixture
def task(docker_home: Path) -> Iterator[Task]:
    with Harness(sandbox="docker", home=docker_home) as harness:
        task = harness.task("charts")
        yield task
        task.close(delete=True)


@pytest.mark.parametrize("session", [False, True], ids=["stateless", "session"])
def test_an_open_figure_comes_back_as_an_image_and_an_artifact(task: Task, session: bool) -> None:
    result = task.exec("python", PLOT + "print('drawn')", session=session)
    assert result.exit_code == 0, result.stderr
    assert result.text == "drawn\n"
    [image] = result.images
    [stored] = result.files
    assert image.mime == "image/png" and image.data.startswith(PNG_MAGIC)
    assert image.path == stored.path and stored.name.startswith("figure-1")
    # Stored byte for byte, listed like any artifact.
    assert task.read(stored.id) == image.data
    assert stored.id in [row.artifact_id for row in task.artifacts()]
    shown = result.as_json()["files"]
    assert shown == [{"path": stored.path, "bytes": len(image.data), "shown": True}]
    # The figure was closed: the next call shows nothing again, and the folder is empty.
    after = task.exec("python", "print('again')", session=session)
    assert after.images == () and after.files == ()
    listing = task.exec("sh", "ls -A /sandbox/outputs | wc -l")
    assert listing.text.strip() == "0"


def test_a_session_keeps_its_data_and_draws_from_it_in_a_later_call(task: Task) -> None:
    first = task.exec("python", "xs = list(range(10))\nys = [x * x for x in xs]", session=True)
    assert first.exit_code == 0 and first.images == ()
    chart = task.exec(
        "python",
        "import matplotlib.pyplot as plt\nplt.plot(xs, ys)\n"
        "plt.savefig('/sandbox/outputs/sq.png')\nplt.close('all')",
        session=True,
    )
    assert chart.exit_code == 0, chart.stderr
    [image] = chart.images
    assert image.path == "/sandbox/offload/sq.png"


def test_files_of_any_kind_become_artifacts_and_data_files_are_tables(task: Task) -> None:
    result = task.exec(
        "sh",
        "printf 'region,total\\nnorth,3\\nsouth,5\\n' > /sandbox/outputs/totals.csv\n"
        "echo '<svg xmlns=\"http://www.w3.org/2000/svg\"/>' > /sandbox/outputs/d.svg\n"
        "echo notes > /sandbox/outputs/readme.md",
    )
    assert result.exit_code == 0, result.stderr
    names = sorted(artifact.name for artifact in result.files)
    assert names == ["d.svg", "readme.md", "totals.csv"]
    assert result.images == ()
    [note] = result.file_notes
    assert note.startswith("d.svg: stored as /sandbox/offload/d.svg, not shown: no model API")
    query = task.exec("sql", 'SELECT sum(total) AS s FROM "totals"')
    assert query.text.splitlines() == ["s", "8"], query.stderr


def test_jpeg_is_shown_and_images_past_the_per_call_bound_are_stored_not_shown(
    task: Task,
) -> None:
    code = (
        "from PIL import Image\n"
        "Image.new('RGB', (8, 8), 'red').save('/sandbox/outputs/a.jpg')\n"
        f"for i in range({MAX_IMAGES}):\n"
        "    Image.new('RGB', (4, 4), (i, 0, 0)).save(f'/sandbox/outputs/p{i}.png')\n"
    )
    result = task.exec("python", code)
    assert result.exit_code == 0, result.stderr
    assert len(result.files) == MAX_IMAGES + 1
    assert len(result.images) == MAX_IMAGES
    assert result.images[0].mime == "image/jpeg"  # taken in name order: a.jpg, then p0..p3
    [note] = result.file_notes
    assert note.startswith(f"p{MAX_IMAGES - 1}.png: stored as /sandbox/offload/p")
    assert note.endswith(f"not shown: at most {MAX_IMAGES} images are shown per call")


def test_a_png_by_name_only_is_stored_but_not_shown(task: Task) -> None:
    result = task.exec("sh", "echo 'not an image' > /sandbox/outputs/fake.png")
    assert [a.name for a in result.files] == ["fake.png"] and result.images == ()


def test_the_tool_returns_the_images_with_its_text(task: Task) -> None:
    output = Toolset(task).call("sandbox_exec", {"lang": "python", "code": PLOT})
    assert not output.is_error, output.text
    body = json.loads(output.text)
    assert [f["shown"] for f in body["files"]] == [True]
    [image] = output.images
    assert image.path == body["files"][0]["path"]


def test_the_cli_names_what_it_stored(docker_home: Path) -> None:
    command = [
        *(str(Path(sys.executable).parent / "spillbox"), "exec", "--task", "cli-charts"),
        *("--lang", "python", PLOT + "print('ok')"),
    ]
    env = {**os.environ, "SPILLBOX_HOME": str(docker_home)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"
    assert "spillbox: stored /sandbox/offload/figure-1.png (" in done.stderr


def test_the_session_example_returns_its_chart(docker_home: Path) -> None:
    """examples/session_analysis.py as a user runs it: the table kept across session calls,
    and the chart drawn from it back as an image, named in the transcript."""
    example = Path(__file__).resolve().parents[2] / "examples" / "session_analysis.py"
    command = [sys.executable, str(example), "--home", str(docker_home / "example")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert '"output": "5000\\n"' in done.stdout  # the first cell loaded the table once
    assert "[image: /sandbox/offload/figure-1.png, image/png, " in done.stdout
    assert "The best month by revenue, and its total: ('2026-" in done.stdout
