"""Gate benchmark: deciding and storing a result against counting it whole.

For each payload size (4 KB to 40 MB of pretty-printed JSON: pull requests with long
bodies, generated deterministically) one run measures, as medians:

- full count: len(enc.encode_ordinary(text)) with the default tiktoken encoding, the floor
  a naive gate pays just to learn that a result is large;
- gate: Task.admit of the result (decide, then store and write the notice when it is
  offloaded) with sandbox="none", a fresh task per run, into a temporary home;
- store floor (printed under the table): what storing alone must cost, encoding the
  text, one sha256 and writing the file, so the gate's own overhead can be told apart.

The ratio gate / full count is the figure to read (absolute times on a shared 2-core
machine are noisy). Targets (issue 2): a 40 MB result decided and stored in under 5% of
its full count; a 4 KB inline result through the gate in under 2 ms.

    python benchmarks/gate_bench.py           # full run, well under a minute
    python benchmarks/gate_bench.py --quick   # a smoke run, sizes up to 1 MB
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spillbox import Harness, ToolResult
from spillbox.tokens import default_counter

KB = 1024
MB = 1024 * KB
SIZES: dict[str, tuple[int, int]] = {
    # label: (bytes, runs)
    "4 KB": (4 * KB, 21),
    "64 KB": (64 * KB, 11),
    "1 MB": (1 * MB, 7),
    "4 MB": (4 * MB, 5),
    "40 MB": (40 * MB, 3),
}
QUICK_SIZES = ("4 KB", "64 KB", "1 MB")
INLINE_BYTES = 4 * KB
INLINE_RUNS = 300
QUICK_INLINE_RUNS = 50

_STATES = ("open", "closed", "merged")
_LABELS = ("bug", "enhancement", "docs", "ci", "security", "performance")
_WORDS = (
    "fix the flaky retry in the scheduler when a worker restarts under load and add a test "
    "that covers the timeout path so the regression cannot come back refactor parser cache "
    "bump dependency update docs handle unicode in titles release notes for the next version"
).split()


def pull_requests(target_bytes: int, seed: int = 1) -> str:
    """A pretty-printed JSON array of PR-like objects, target_bytes long (ASCII)."""
    rng = random.Random(seed)
    prs: list[dict[str, Any]] = []
    size = len("[\n\n]")
    while size < target_bytes:
        pr = _pull_request(rng, len(prs) + 1)
        # Its bytes inside the array: indented two more, then ",\n" (or the "\n" before "]").
        cost = len(json.dumps(pr, indent=2).replace("\n", "\n  ")) + 2 + 2
        over = size + cost - target_bytes
        if over > 0:  # the last one: shorten its body to land on the target
            if over >= len(pr["body"]) and prs:
                break
            pr["body"] = pr["body"][: max(0, len(pr["body"]) - over)]
            cost -= min(over, cost)
        prs.append(pr)
        size += cost
    return json.dumps(prs, indent=2)


def _pull_request(rng: random.Random, number: int) -> dict[str, Any]:
    return {
        "id": 900_000_000 + number,
        "number": number,
        "title": " ".join(rng.choices(_WORDS, k=rng.randint(4, 9))).capitalize(),
        "state": rng.choice(_STATES),
        "user": {"login": f"dev-{rng.randint(1, 400)}", "id": rng.randint(1, 10**7)},
        "labels": [{"name": name} for name in rng.sample(_LABELS, k=rng.randint(0, 3))],
        "draft": rng.random() < 0.1,
        "created_at": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T09:30:00Z",
        "comments": rng.randint(0, 40),
        "body": " ".join(rng.choices(_WORDS, k=rng.randint(60, 600))),
    }


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _gate_ms(harness: Harness, payload: str, runs: int) -> tuple[float, str | None]:
    """Median Task.admit time over fresh tasks; the reason the gate gave."""
    times = []
    reason: str | None = None
    ids = (f"bench-{i}" for i in itertools.count())
    for _ in range(runs):
        task_id = next(ids)
        with harness.task(task_id) as task:
            start = time.perf_counter()
            (admitted,) = task.admit([ToolResult(call_id="c1", tool="list_prs", content=payload)])
            times.append(time.perf_counter() - start)
            reason = admitted.reason
        harness.remove(task_id)
    return statistics.median(times) * 1000, reason


def _store_floor_ms(folder: Path, payload: str, runs: int) -> float:
    times = []
    for i in range(runs):
        path = folder / f"floor-{i}.bin"
        start = time.perf_counter()
        data = payload.encode()
        hashlib.sha256(data).hexdigest()
        path.write_bytes(data)
        times.append(time.perf_counter() - start)
        path.unlink()
    return statistics.median(times) * 1000


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure every size in one run; one dict per row, the last for the inline result."""
    counter = default_counter()
    labels = QUICK_SIZES if quick else tuple(SIZES)
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="spillbox-bench-") as home,
        Harness(sandbox="none", home=Path(home), environ={}, gc_interval=-1) as harness,
    ):
        for label in labels:
            target, runs = SIZES[label]
            runs = max(3, runs // 2) if quick else runs
            payload = pull_requests(target)
            full_ms = _median_ms(lambda p=payload: counter.count(p), runs)
            gate_ms, reason = _gate_ms(harness, payload, runs)
            floor_ms = _store_floor_ms(Path(home), payload, runs)
            rows.append(
                {
                    "payload": label,
                    "bytes": len(payload.encode()),
                    "runs": runs,
                    "full_ms": full_ms,
                    "gate_ms": gate_ms,
                    "ratio": gate_ms / full_ms,
                    "reason": reason,
                    "store_floor_ms": floor_ms,
                }
            )

        payload = pull_requests(INLINE_BYTES, seed=2)
        runs = QUICK_INLINE_RUNS if quick else INLINE_RUNS
        with harness.task("bench-inline") as task:
            result = [ToolResult(call_id="c1", tool="list_prs", content=payload)]
            assert not task.admit(result)[0].offloaded
            gate_ms = _median_ms(lambda: task.admit(result), runs)
        full_ms = _median_ms(lambda: counter.count(payload), runs)
        rows.append(
            {
                "payload": "4 KB inline",
                "bytes": len(payload.encode()),
                "runs": runs,
                "full_ms": full_ms,
                "gate_ms": gate_ms,
                "ratio": gate_ms / full_ms,
                "reason": None,
                "store_floor_ms": 0.0,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| payload | bytes | full count (ms) | gate decide+store (ms) | ratio (gate/full) |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['payload']} | {row['bytes']:,} | {row['full_ms']:.2f} | "
            f"{row['gate_ms']:.2f} | {row['ratio']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    rows = run(quick="--quick" in argv)
    print(table(rows[:-1]))
    inline = rows[-1]
    print(
        f"\n4 KB inline result through the gate: {inline['gate_ms']:.3f} ms median of "
        f"{inline['runs']} (full count of it: {inline['full_ms']:.3f} ms)"
    )
    offloaded = ", ".join(f"{row['payload']}: {row['reason'] or 'inline'}" for row in rows[:-1])
    print(f"gate decisions: {offloaded}")
    floors = ", ".join(
        f"{row['payload']}: {row['store_floor_ms']:.2f} ms" for row in rows[:-1] if row["reason"]
    )
    print(f"store floor (encode + sha256 + write, no gate): {floors}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
