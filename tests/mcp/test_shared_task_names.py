"""Two proxies on one task never give two results the same name (issue 22 item 6): the
catalog numbers each task's calls (catalog.calls.next_call_id), in one write transaction, so
processes that call at once get git_log_1, git_log_2, ... once each, and a call id a
notice shows finds that call's result (`spillbox pin`), not the other proxy's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
from mcp_client import BIN, git_server, proxy_params, text_of

from mcp import Client
from spillbox import Harness, ToolResult, parse_notice
from spillbox.catalog import Catalog

pytest_plugins = ["mcp_fixtures"]

NUMBERER = """
import json, sys
from pathlib import Path
from spillbox.catalog import Catalog
from spillbox.catalog.calls import next_call_id

catalog = Catalog(Path(sys.argv[1]), url=sys.argv[2] or None)
print(json.dumps([next_call_id(catalog, "shared", "git_log") for _ in range(int(sys.argv[3]))]))
catalog.close()
"""

BLOCK_NUMBERER = """
import json, sys
from pathlib import Path
from spillbox.catalog import Catalog
from spillbox.catalog.calls import CallIds

catalog = Catalog(Path(sys.argv[1]), url=sys.argv[2] or None)
ids = CallIds(catalog, "shared")
print(json.dumps([ids.next("git_log") for _ in range(int(sys.argv[3]))]))
catalog.close()
"""


def test_processes_numbering_one_tasks_calls_at_once_get_each_number_once(
    home: Path, catalog_url: str | None
) -> None:
    given = numbered_at_once(NUMBERER, home, catalog_url)
    every = [call_id for ids in given for call_id in ids]
    assert sorted(every) == sorted(f"git_log_{n}" for n in range(1, 161))
    for ids in given:  # each process's own in the order it got them
        assert ids == sorted(ids, key=lambda call_id: int(call_id.rsplit("_", 1)[1]))


def test_processes_numbering_in_blocks_at_once_never_give_an_id_twice(
    home: Path, catalog_url: str | None
) -> None:
    """Each process reserves 1, 2, 4, ... numbers at a time: no id is given twice, each
    process's come in order, and what is skipped is only what a process reserved and did
    not use (its last block's rest)."""
    given = numbered_at_once(BLOCK_NUMBERER, home, catalog_url)
    every = [int(call_id.rsplit("_", 1)[1]) for ids in given for call_id in ids]
    assert len(every) == len(set(every)) == 160
    for ids in given:
        numbers = [int(call_id.rsplit("_", 1)[1]) for call_id in ids]
        assert numbers == sorted(numbers)
    # Blocks of 1, 2, 4, 8, 16, 16 give 40 calls 47 numbers: 7 unused a process at most.
    assert max(every) <= 4 * 47


def numbered_at_once(script: str, home: Path, catalog_url: str | None) -> list[list[str]]:
    """The ids each of four processes running script got, asking for 40 each at once."""
    Catalog(home, url=catalog_url).close()  # migrated once, before the race
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(home), catalog_url or "", "40"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    return [json.loads(worker.communicate(timeout=300)[0]) for worker in workers]


def test_a_task_numbers_most_calls_without_a_catalog_write(home: Path) -> None:
    """One process's ids for a tool are dense (git_log_1, git_log_2, ...); the catalog's
    counter moves in blocks, so a second Task on the same task continues after the first's
    block, and the first's next block comes after the second's."""
    with Harness(sandbox="none", home=home) as harness:
        first, second = harness.task("shared"), harness.task("shared")
        assert first.reserved_call_id("git_log") is None  # nothing reserved yet
        ids = [first.next_call_id("git_log") for _ in range(20)]
        assert ids == [f"git_log_{n}" for n in range(1, 21)]
        [row] = harness.catalog.db.rows("call numbers", "SELECT last FROM call_numbers")
        assert row["last"] == 31  # blocks of 1, 2, 4, 8, 16: five writes for twenty calls
        assert [first.reserved_call_id("git_log") for _ in range(11)] == [
            f"git_log_{n}" for n in range(21, 32)
        ]
        assert first.reserved_call_id("git_log") is None  # the block is used up
        assert second.next_call_id("git_log") == "git_log_32"
        assert first.next_call_id("git_log") == "git_log_33"


def test_a_number_a_stored_result_already_has_is_passed_over(home: Path) -> None:
    """A task whose results a proxy from before the counter stored (git_log_1, git_log_2)
    numbers on after them; other tools and tasks count on their own."""
    rows = json.dumps([{"id": i, "pad": "x" * 200} for i in range(400)])
    with Harness(sandbox="none", home=home) as harness:
        task = harness.task("old")
        for call_id in ("git_log_1", "git_log_2"):
            [admitted] = task.admit([ToolResult(call_id, "git_log", rows + call_id)])
            assert admitted.offloaded
        assert [task.next_call_id("git_log") for _ in range(2)] == ["git_log_3", "git_log_4"]
        assert task.next_call_id("git_diff") == "git_diff_1"
        assert harness.task("other").next_call_id("git_log") == "git_log_1"


def test_a_tool_name_no_catalog_holds_is_numbered_and_then_refused(home: Path) -> None:
    with Harness(sandbox="none", home=home) as harness:
        task = harness.task("odd")
        call_id = task.next_call_id("bad\0name\ud800")
        assert call_id == "bad\\x00name\\ud800_1"
        [admitted] = task.admit([ToolResult(call_id, "bad\0name\ud800", "x" * 100_000)])
    assert admitted.reason == "refused" and "lone surrogate" in admitted.text


def test_two_proxies_on_one_task_name_their_results_apart(git_repo: Path, home: Path) -> None:
    """Two clients, one of each era, each with its own proxy on task "shared", log at once
    (counts apart, so the payloads differ); each notice's call id pins its own result."""
    notices = anyio.run(two_proxies_log, git_repo, home)
    call_ids = sorted(notice["call_id"] for notice in notices)
    assert len(set(call_ids)) == 4 and all(c.startswith("git_log_") for c in call_ids), call_ids
    spillbox = str(BIN / "spillbox")
    for notice in notices:
        pinned = subprocess.run(
            [spillbox, "pin", "--home", str(home), "--sandbox", "none", "--json", "shared"]
            + [notice["call_id"]],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(pinned.stdout)
        assert row["call_id"] == notice["call_id"] and row["path"] == notice["path"], row


async def two_proxies_log(git_repo: Path, home: Path) -> list[dict[str, str]]:
    """The notices of two git_log calls by each of two clients at once."""
    notices: list[dict[str, str]] = []

    async def log(mode: str, count: int) -> None:
        params = proxy_params(home, git_server(git_repo), "--task", "shared")
        async with Client(params, mode=mode) as client:
            for n in (count, count + 1):  # payloads apart: the same bytes are stored once
                args = {"repo_path": str(git_repo), "max_count": n}
                notice = parse_notice(text_of(await client.call_tool("git_log", args)))
                assert notice is not None
                notices.append(notice)

    async with anyio.create_task_group() as group:
        group.start_soon(log, "2026-07-28", 600)
        group.start_soon(log, "legacy", 900)
    return notices
