"""Gate benchmark: deciding and storing a result against counting it whole.

For each payload size (4 KB to 40 MB of pretty-printed JSON: pull-request-like objects
from common.pull_requests, deterministic) one run measures, as medians:

- full count: len(enc.encode_ordinary(text)) with the default tiktoken encoding, the floor
  a naive gate pays just to learn that a result is large;
- gate: Task.admit of the result (decide, then store and write the notice when it is
  offloaded) with sandbox="none", a fresh task per run, into a temporary home;
- store floor (under the table): what storing alone must cost, encoding the
  text, one sha256 and writing the file, so the gate's own overhead can be told apart;
- redaction (under the table): redact_payload of the encoded payload, what `--redact` adds
  to an offload, against that floor (issue 16: within 2x at 40 MB).

The ratio gate / full count is the figure to read (absolute times on a shared 2-core
machine are noisy). Targets (issue 2): a 40 MB result decided and stored in under 5% of
its full count; a 4 KB inline result through the gate in under 2 ms.

The wrapped rows hold the same records inside an object, as most APIs return them
(Slack's {"ok", "messages": [...], "has_more", "response_metadata"}: keys after the
records, which the profile reads from the end). For every row the profile alone
(spillbox.profile.profile, the shape the notice states) is measured too, against the
same full count. A wrapped result over 256 KB is read from its ends, never parsed whole
(estimated counts). Targets (issue 15): the 40 MB one decided and stored in under 5% of
its full count, as a bare array is, and the profile of the 16 MB one in under 5% of its
full count: the issue asks that the profile stay within the gate's time. Issue 24 item 4:
the gate at most 1.0x the store floor (same run) for arrays and wrapped objects of 1, 4,
16 and 40 MB.

    python benchmarks/gate_bench.py           # full run, well under a minute
    python benchmarks/gate_bench.py --quick   # a smoke run, sizes up to 1 MB
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from common import KB, MB, Target, bench_main, median_ms, pull_requests, repeat_ms, timed
from spillbox import Harness, ToolResult
from spillbox.notice import describe
from spillbox.profile import profile
from spillbox.redaction import redact_payload
from spillbox.tokens import default_counter

SIZES: dict[str, tuple[int, int]] = {
    # label: (bytes, runs)
    "4 KB": (4 * KB, 21),
    "64 KB": (64 * KB, 11),
    "1 MB": (1 * MB, 7),
    "4 MB": (4 * MB, 5),
    "16 MB": (16 * MB, 3),
    "40 MB": (40 * MB, 3),
    "1 MB wrapped": (1 * MB, 7),
    "4 MB wrapped": (4 * MB, 5),
    "16 MB wrapped": (16 * MB, 3),
    "40 MB wrapped": (40 * MB, 3),
}
QUICK_SIZES = ("4 KB", "64 KB", "1 MB", "1 MB wrapped")
INLINE_BYTES = 4 * KB
INLINE_RUNS = 300
QUICK_INLINE_RUNS = 50
LARGE_RATIO_MAX = 0.05
REDACTION_FLOOR_RATIO_MAX = 2.0
INLINE_MS_MAX = 2.0
STORE_FLOOR_RATIO_MAX = 1.0
STORE_FLOOR_SIZES = ("1 MB", "4 MB", "16 MB", "40 MB")
"""Issue 24 item 4: the gate at most 1.0x the store floor for arrays and wrapped objects of
these sizes."""


def _payload(label: str, target: int) -> str:
    """Pull requests as a JSON array, or wrapped in a Slack-like object (one line, as an
    API returns it) of about the same size."""
    if not label.endswith("wrapped"):
        return pull_requests(target, seed=1)
    records = pull_requests(target - 200, seed=1, pretty=False)
    return (
        '{"ok": true, "messages": ' + records + ', "has_more": true, "pin_count": 0, '
        '"response_metadata": {"next_cursor": "bmV4dF90czoxNTEyMDg1ODYxMDAwNTQz"}}'
    )


def _shape(payload: str) -> tuple[float, str]:
    """The profile of a payload: its median time over a few runs, and what it says (with
    the true record count beside an estimated one)."""
    data = payload.encode()
    profile_ms = repeat_ms(partial(profile, data, payload), 5)
    shape = profile(data, payload)
    said = describe(shape)
    records = shape.records
    if records is not None:
        actual = len(json.loads(payload)[records.path[0]])
        exact = "exact" if records.count_exact else "estimated"
        said += f", records {records.path[0]}: {records.count:,} ({exact}; {actual:,} in fact)"
    return profile_ms, said


def _gate_ms(harness: Harness, payload: str, runs: int) -> tuple[float, str | None]:
    """Median Task.admit time over fresh tasks; the reason the gate gave."""
    times = []
    reason: str | None = None
    ids = (f"bench-{i}" for i in itertools.count())
    for _ in range(runs):
        task_id = next(ids)
        with harness.task(task_id) as task:
            result = [ToolResult(call_id="c1", tool="list_prs", content=payload)]
            seconds, (admitted,) = timed(partial(task.admit, result))
            times.append(seconds)
            reason = admitted.reason
        harness.remove(task_id)
    return median_ms(times), reason


def _store_floor_ms(folder: Path, payload: str, runs: int) -> float:
    """Storing alone: encode the text, one sha256, write the file."""

    def store(path: Path) -> None:
        data = payload.encode()
        hashlib.sha256(data).hexdigest()
        path.write_bytes(data)

    times = []
    for i in range(runs):
        path = folder / f"floor-{i}.bin"
        times.append(timed(partial(store, path))[0])
        path.unlink()
    return median_ms(times)


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
            payload = _payload(label, target)
            full_ms = repeat_ms(partial(counter.count, payload), runs)
            profile_ms, shape = _shape(payload)
            gate_ms, reason = _gate_ms(harness, payload, runs)
            floor_ms = _store_floor_ms(Path(home), payload, runs)
            redact_ms = repeat_ms(partial(redact_payload, payload.encode()), runs)
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
                    "redact_ms": redact_ms,
                    "profile_ms": profile_ms,
                    "shape": shape,
                }
            )

        payload = pull_requests(INLINE_BYTES, seed=2)
        runs = QUICK_INLINE_RUNS if quick else INLINE_RUNS
        with harness.task("bench-inline") as task:
            result = [ToolResult(call_id="c1", tool="list_prs", content=payload)]
            assert not task.admit(result)[0].offloaded
            gate_ms = repeat_ms(lambda: task.admit(result), runs)
        full_ms = repeat_ms(lambda: counter.count(payload), runs)
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


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table, then the inline result, the gate's decisions and the store floor."""
    *sized, inline = rows
    lines = [
        "| payload | bytes | full count (ms) | gate decide+store (ms) | ratio (gate/full) "
        "| store floor (ms) | ratio (gate/store floor) | profile (ms) | ratio (profile/full) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in sized:
        lines.append(
            f"| {row['payload']} | {row['bytes']:,} | {row['full_ms']:.2f} | "
            f"{row['gate_ms']:.2f} | {row['ratio']:.3f} | {row['store_floor_ms']:.2f} | "
            f"{_floor_ratio(row):.2f} | {row['profile_ms']:.2f} | "
            f"{row['profile_ms'] / row['full_ms']:.4f} |"
        )
    shapes = "; ".join(
        f"{row['payload']}: {row['shape']}" for row in sized if row["payload"].endswith("wrapped")
    )
    decisions = ", ".join(f"{row['payload']} {row['reason'] or 'inline'}" for row in sized)
    floors = ", ".join(
        f"{row['payload']} {row['store_floor_ms']:.2f} ms" for row in sized if row["reason"]
    )
    lines += [
        "",
        f"4 KB inline result through the gate: {inline['gate_ms']:.3f} ms, median of "
        f"{inline['runs']} (a full count of it: {inline['full_ms']:.3f} ms).",
        "",
        f"Gate decisions: {decisions}.",
        "",
        f"Store floor (encode + sha256 + write, no gate): {floors}.",
        "",
        f"Wrapped payloads as profiled: {shapes}.",
        "",
        "Redaction (`--redact`, redact_payload) against the store floor: "
        + ", ".join(
            f"{row['payload']} {row['redact_ms']:.2f} ms ({_redaction_ratio(row):.2f}x)"
            for row in sized
            if row["reason"]
        )
        + ".",
    ]
    return "\n".join(lines)


def _redaction_ratio(row: dict[str, Any]) -> float:
    return float(row["redact_ms"]) / float(row["store_floor_ms"])


def _floor_ratio(row: dict[str, Any]) -> float:
    return float(row["gate_ms"]) / float(row["store_floor_ms"])


def _store_floor_target(sized: list[dict[str, Any]]) -> Target:
    """Issue 24 item 4, over the rows of its sizes that this run measured."""
    rows = [row for row in sized if row["payload"].removesuffix(" wrapped") in STORE_FLOOR_SIZES]
    worst = max(rows, key=_floor_ratio)
    return Target(
        goal=f"the gate at most {STORE_FLOOR_RATIO_MAX:g}x the store floor (encode + sha256 + "
        "write, same run) for arrays and wrapped objects of 1, 4, 16 and 40 MB",
        met=None
        if len(rows) < 2 * len(STORE_FLOOR_SIZES)
        else _floor_ratio(worst) <= STORE_FLOOR_RATIO_MAX,
        measured=", ".join(f"{row['payload']} {_floor_ratio(row):.2f}x" for row in rows),
    )


def targets(rows: list[dict[str, Any]]) -> list[Target]:
    """Issue 2's targets, against this run's rows."""
    *sized, inline = rows
    largest = next((row for row in sized if row["payload"] == "40 MB"), None)
    wrapped = next((row for row in sized if row["payload"] == "40 MB wrapped"), None)
    scanned = next((row for row in sized if row["payload"] == "16 MB wrapped"), None)
    return [
        _store_floor_target(sized),
        Target(
            goal=f"a 40 MB result decided and stored in under {LARGE_RATIO_MAX:.0%} "
            "of its full count",
            met=None if largest is None else largest["ratio"] < LARGE_RATIO_MAX,
            measured="quick run, no 40 MB payload"
            if largest is None
            else f"ratio {largest['ratio']:.3f}: {largest['gate_ms']:.0f} ms against "
            f"{largest['full_ms']:.0f} ms",
        ),
        Target(
            goal=f"a 40 MB wrapped result (records inside an object) decided and stored in "
            f"under {LARGE_RATIO_MAX:.0%} of its full count",
            met=None if wrapped is None else wrapped["ratio"] < LARGE_RATIO_MAX,
            measured="quick run, no 40 MB payload"
            if wrapped is None
            else f"ratio {wrapped['ratio']:.3f}: {wrapped['gate_ms']:.0f} ms against "
            f"{wrapped['full_ms']:.0f} ms; its profile alone {wrapped['profile_ms']:.1f} ms, "
            f"ratio {wrapped['profile_ms'] / wrapped['full_ms']:.4f}",
        ),
        Target(
            goal=f"the profile of a 16 MB wrapped result (read from its ends) in under "
            f"{LARGE_RATIO_MAX:.0%} of its full count",
            met=None
            if scanned is None
            else scanned["profile_ms"] / scanned["full_ms"] < LARGE_RATIO_MAX,
            measured="quick run, no 16 MB payload"
            if scanned is None
            else f"ratio {scanned['profile_ms'] / scanned['full_ms']:.4f}: "
            f"{scanned['profile_ms']:.1f} ms against {scanned['full_ms']:.0f} ms; decided and "
            f"stored in {scanned['gate_ms']:.0f} ms, ratio {scanned['ratio']:.3f}",
        ),
        Target(
            goal=f"a 4 KB inline result through the gate in under {INLINE_MS_MAX:g} ms",
            met=inline["gate_ms"] < INLINE_MS_MAX,
            measured=f"{inline['gate_ms']:.3f} ms; a full count of it takes "
            f"{inline['full_ms']:.3f} ms, ratio {inline['ratio']:.2f}",
        ),
        Target(
            goal=f"a 40 MB payload redacted within {REDACTION_FLOOR_RATIO_MAX:g}x its store floor",
            met=None if largest is None else _redaction_ratio(largest) <= REDACTION_FLOOR_RATIO_MAX,
            measured="quick run, no 40 MB payload"
            if largest is None
            else f"ratio {_redaction_ratio(largest):.2f}: {largest['redact_ms']:.0f} ms against "
            f"{largest['store_floor_ms']:.0f} ms",
        ),
    ]


if __name__ == "__main__":
    raise SystemExit(bench_main(run, markdown, targets, sys.argv[1:]))
