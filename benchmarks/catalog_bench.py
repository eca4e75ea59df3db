"""Catalog benchmark: what the catalog adds to the offload of a small result.

A 4 KB result (pull-request JSON, a different one each run, so none de-duplicates) is
offloaded through Task.admit with sandbox="none" and a per-call limit low enough that it
goes; one run measures, as medians:

- offload: Task.admit of the result (profile, stage, de-duplication query, link, catalog
  row and its access-log entry, notice);
- store floor: encoding the text, one sha256 and writing the file, what storing alone
  must cost;
- catalog: the catalog's share alone, the de-duplication query (which also says whether
  the id is taken) and the artifact's row with its log entry (Catalog.identical +
  Catalog.add_artifact), on a task of its own.

And the lookups that run at every exec and every history append, in a task of
LOOKUP_ARTIFACTS artifacts, against listing the task whole (what they did before):

- named: the artifacts a script names (Catalog.artifacts(named_in=code), an exec's);
- of a call: the rows of one call id (Catalog.artifacts(call_id=...), the history's).

Read the ratios (offload / floor, catalog / offload): absolute times on a shared 2-core
machine are noisy. SPILLBOX_CATALOG_URL, when set, runs it against that database.

    python benchmarks/catalog_bench.py           # 300 offloads
    python benchmarks/catalog_bench.py --quick   # 60
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import KB, bench_main, median_ms, pull_requests, timed
from spillbox import Harness, Policy, ToolResult
from spillbox.types import ArtifactRow

PAYLOAD_BYTES = 4 * KB
RUNS = 300
QUICK_RUNS = 60
LOOKUP_ARTIFACTS = 1_000


def _row(task_id: str, n: int) -> ArtifactRow:
    now = time.time()
    return ArtifactRow(
        task_id=task_id,
        artifact_id=f"a{n}",
        call_id=f"c{n}",
        tool="list_prs",
        name=f"c{n}.json",
        path=f"/sandbox/offload/c{n}.json",
        bytes=PAYLOAD_BYTES,
        tokens=1000,
        tokens_exact=True,
        sha256=hashlib.sha256(str(n).encode()).hexdigest(),
        created_at=now,
        last_access_at=now,
        expires_at=now + 3600,
        state="live",
        pinned=False,
        redactions=0,
        deleted_at=None,
        deleted_by=None,
    )


def run(quick: bool = False) -> dict[str, Any]:
    runs = QUICK_RUNS if quick else RUNS
    payloads = [pull_requests(PAYLOAD_BYTES, seed=1000 + i) for i in range(runs)]
    with (
        tempfile.TemporaryDirectory(prefix="spillbox-bench-") as home,
        Harness(
            sandbox="none", home=Path(home), gc_interval=-1, policy=Policy(per_call_tokens=100)
        ) as harness,
    ):
        offloads = []
        with harness.task("bench-offload") as task:
            for i, payload in enumerate(payloads):
                result = [ToolResult(call_id=f"c{i}", tool="list_prs", content=payload)]
                seconds, (admitted,) = timed(lambda result=result: task.admit(result))
                assert admitted.offloaded
                offloads.append(seconds)
        harness.remove("bench-offload")

        floors = []
        for i, payload in enumerate(payloads):
            path = Path(home) / f"floor-{i}.json"

            def store(payload: str = payload, path: Path = path) -> None:
                data = payload.encode()
                hashlib.sha256(data).hexdigest()
                path.write_bytes(data)

            floors.append(timed(store)[0])
            path.unlink()

        catalog = harness.catalog
        catalog.open_task("bench-catalog", "{}")
        rows = []
        for i in range(runs):
            row = _row("bench-catalog", i)

            def record(row: ArtifactRow = row) -> None:
                catalog.identical(row.task_id, row.sha256, row.bytes, row.artifact_id)
                catalog.add_artifact(row)

            rows.append(timed(record)[0])
        # The task above now holds `runs` artifacts; the lookups get a task of their own.
        catalog.open_task("bench-lookups", "{}")
        for i in range(LOOKUP_ARTIFACTS):
            catalog.add_artifact(_row("bench-lookups", i))
        code = f'SELECT count(*) FROM "a{LOOKUP_ARTIFACTS // 2}"'
        lookups = {
            "whole": lambda: catalog.artifacts("bench-lookups", include_deleted=True),
            "named": lambda: catalog.artifacts("bench-lookups", True, named_in=code),
            "call": lambda: catalog.artifacts("bench-lookups", call_id="c7"),
        }
        lookup_ms = {
            what: median_ms([timed(lookup)[0] for _ in range(runs)])
            for what, lookup in lookups.items()
        }
    return {
        "runs": runs,
        "offload_ms": median_ms(offloads),
        "floor_ms": median_ms(floors),
        "catalog_ms": median_ms(rows),
        "lookup_ms": lookup_ms,
    }


def markdown(result: dict[str, Any]) -> str:
    offload, floor, catalog = result["offload_ms"], result["floor_ms"], result["catalog_ms"]
    lookup = result["lookup_ms"]
    return "\n".join(
        [
            "| what (4 KB, medians of "
            f"{result['runs']}) | ms | ratio to the store floor | share of the offload |",
            "|---|---:|---:|---:|",
            f"| offload (Task.admit) | {offload:.3f} | {offload / floor:.1f} | 1.00 |",
            f"| catalog (identical + add_artifact) | {catalog:.3f} | {catalog / floor:.1f} | "
            f"{catalog / offload:.2f} |",
            f"| store floor (encode + sha256 + write) | {floor:.3f} | 1.0 | "
            f"{floor / offload:.2f} |",
            "",
            f"| lookup in a task of {LOOKUP_ARTIFACTS:,} artifacts | ms "
            "| ratio to listing it whole |",
            "|---|---:|---:|",
            *(
                f"| {what} | {lookup[key]:.3f} | {lookup[key] / lookup['whole']:.3f} |"
                for what, key in (
                    ("the artifacts a script names (an exec's)", "named"),
                    ("the rows of one call id (a history append's)", "call"),
                    ("the whole task (what both listed before)", "whole"),
                )
            ),
        ]
    )


if __name__ == "__main__":
    raise SystemExit(bench_main(run, markdown, lambda result: [], sys.argv[1:]))
