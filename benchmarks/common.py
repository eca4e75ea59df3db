"""What the benchmarks share: the payload they feed in, timing, targets, the machine.

Each bench script imports this as ``common``: run as a script (``python
benchmarks/gate_bench.py``) or from run.py, Python puts the benchmarks folder first on
sys.path, whatever the working directory.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

KB = 1024
MB = 1024 * KB

_STATES = ("open", "closed", "merged")
_LABELS = ("bug", "enhancement", "docs", "ci", "security", "performance", "good first issue")
_WORDS = (
    "fix the flaky retry in the scheduler when a worker restarts under load and add a test "
    "that covers the timeout path so the regression cannot come back refactor parser cache "
    "bump dependency update docs handle unicode in titles release notes for the next version"
).split()


def pull_requests(target_bytes: int, *, seed: int = 0, pretty: bool = True) -> str:
    """A JSON array of pull-request-like objects, exactly target_bytes long (ASCII).

    The same seed gives the same text; different seeds give different ids and bodies, so
    payloads never deduplicate against each other. pretty=True is json.dumps(indent=2),
    what a tool printing for people returns; pretty=False is one line, as an API returns.
    Targets smaller than one object give one object, with an empty body.
    """
    rng = random.Random(seed)
    indent = 2 if pretty else None
    separator = ",\n" if pretty else ", "
    prs: list[dict[str, Any]] = []
    size = len(json.dumps([{}], indent=indent)) - _item_bytes({}, indent) - len(separator)
    while size < target_bytes:
        pr = _pull_request(rng, seed, len(prs) + 1)
        cost = _item_bytes(pr, indent) + len(separator)
        short = target_bytes - size
        if cost > short:  # the last one: its body absorbs the difference
            if short < cost - len(pr["body"]) and prs:  # no room for one more: grow the last
                pr = prs.pop()
                size -= _item_bytes(pr, indent) + len(separator)
                short = target_bytes - size
            fixed = _item_bytes(pr, indent) + len(separator) - len(pr["body"])
            pr["body"] = _fit(rng, pr["body"], max(0, short - fixed))
            cost = _item_bytes(pr, indent) + len(separator)
        prs.append(pr)
        size += cost
    return json.dumps(prs, indent=indent)


def _pull_request(rng: random.Random, seed: int, number: int) -> dict[str, Any]:
    return {
        "id": 900_000_000 + seed * 10_000_000 + number,
        "number": number,
        "title": " ".join(rng.choices(_WORDS, k=rng.randint(4, 10))).capitalize(),
        "state": rng.choice(_STATES),
        "user": {"login": f"dev-{rng.randint(1, 400)}", "id": rng.randint(1, 10**7)},
        "labels": [{"name": name} for name in rng.sample(_LABELS, k=rng.randint(0, 3))],
        "draft": rng.random() < 0.1,
        "created_at": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
        f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
        "comments": rng.randint(0, 40),
        "additions": rng.randint(0, 2_000),
        "deletions": rng.randint(0, 1_500),
        "html_url": f"https://github.com/acme/widgets/pull/{number}",
        "body": " ".join(rng.choices(_WORDS, k=rng.randint(20, 400))),
    }


def _item_bytes(pr: dict[str, Any], indent: int | None) -> int:
    """Its bytes inside the array: indented one level further when pretty."""
    text = json.dumps(pr, indent=indent)
    return len(text) + text.count("\n") * 2 + 2 if indent else len(text)


def _fit(rng: random.Random, body: str, length: int) -> str:
    """body cut, or lengthened with more words, to exactly length characters."""
    while len(body) < length:
        body += " " + " ".join(rng.choices(_WORDS, k=64))
    return body[:length]


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """The seconds fn() took, and what it returned."""
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def median_ms(samples: Iterable[float]) -> float:
    """The median of timings in seconds, in milliseconds."""
    return statistics.median(samples) * 1000


def repeat_ms(fn: Callable[[], object], runs: int) -> float:
    """The median time of runs calls of fn(), in milliseconds."""
    return median_ms(timed(fn)[0] for _ in range(runs))


@dataclass(frozen=True)
class Target:
    """One target a bench states, and how this run fared against it."""

    goal: str
    """The target, in words."""
    met: bool | None
    """None when the run did not measure it (a quick run)."""
    measured: str
    """What this run measured, the ratio first."""
    note: str = ""
    """Why a target was missed, where the run tells."""


def targets_markdown(targets: Iterable[Target]) -> str:
    lines = []
    for target in targets:
        verdict = {True: "met", False: "**missed**", None: "not measured"}[target.met]
        note = f" {target.note}" if target.note else ""
        lines.append(f"- {target.goal}: {verdict} ({target.measured}).{note}")
    return "\n".join(lines)


def bench_main(
    run: Callable[[bool], T],
    markdown: Callable[[T], str],
    targets: Callable[[T], list[Target]],
    argv: list[str],
) -> int:
    """What a bench does run as a script: measure, print its tables and its targets."""
    results = run("--quick" in argv)
    print(markdown(results))
    print()
    print(targets_markdown(targets(results)))
    return 0


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def machine() -> dict[str, str]:
    """What the figures were measured on, read now (so the load is the load at start)."""
    return {
        "cores": str(os.cpu_count()),
        "memory": _memory(),
        "CPU": _proc_field("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "Python": f"{platform.python_version()} ({platform.python_implementation()})",
        "tiktoken": _version("tiktoken"),
        "duckdb (host)": _version("duckdb"),
        "Docker engine": _docker_engine(),
        "load average (1 / 5 / 15 min)": load_average(),
    }


def machine_markdown(facts: dict[str, str]) -> str:
    lines = ["| what | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in facts.items()]
    return "\n".join(lines)


def _proc_field(path: str, field: str) -> str | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == field:
            return value.strip()
    return None


def _memory() -> str:
    total = _proc_field("/proc/meminfo", "MemTotal")  # "24684084 kB"
    if total is None:
        return "unknown"
    return f"{int(total.split()[0]) / 1024**2:.1f} GiB"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _docker_engine() -> str:
    import docker
    import docker.errors

    try:
        client = docker.from_env()
    except docker.errors.DockerException:
        return "not reachable"
    try:
        version = client.version()
    finally:
        client.close()
    return f"{version.get('Version', '?')} (API {version.get('ApiVersion', '?')})"
