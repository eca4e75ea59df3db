"""The demo: three agent tasks whose tool results are far too big for context, answered in
code mode inside real sandboxes.

    spillbox demo [--home DIR]          # or `make demo`, or python examples/<name>.py

Each scenario is one user tool that returns a large JSON payload (generated from a fixed
seed), a question with one right answer, and a scripted model that does what a capable
model does with a notice: call the tool, read the notice, query the offloaded file with
DuckDB in the sandbox, and answer from the rows the query printed. The answer is checked
against one computed in Python from the same data, and the context the model used is
compared with what sending every result inline would have cost.

    >>> with Harness(sandbox="docker", gc_interval=-1).task("t1") as task:  # doctest: +SKIP
    ...     result = run_scenario(task, pull_requests())
    >>> result.correct, result.saving > 100  # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import random
import secrets
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from spillbox.errors import SpillboxError
from spillbox.harness import Harness, Task
from spillbox.loop import ScriptedModel, ToolCall, Turn, UserTool, run
from spillbox.notice import parse_notice
from spillbox.sandbox.docker import connect
from spillbox.sandbox.image import ensure_image
from spillbox.tools import SANDBOX_EXEC, ToolSpec

SHOWN_RESULT_LINES = 6
SHOWN_RESULT_CHARS = 600
SHOWN_CODE_LINES = 25
SHOWN_ARGUMENT_CHARS = 160


@dataclass(frozen=True)
class Scenario:
    """One agent task: a user tool with a big answer, a question, and the way to answer it."""

    name: str
    title: str
    tool: UserTool
    arguments: Mapping[str, Any]
    """What the model passes to the tool."""
    question: str
    sql: str
    """The DuckDB query the model writes, with {table} where the offloaded result goes."""
    answer: Callable[[Mapping[str, str]], str]
    """The model's answer from the first row the query printed (CSV fields by column)."""
    expected: str
    """The right answer, computed in Python from the generated data."""


@dataclass(frozen=True)
class ScenarioResult:
    """What one scenario did: the answer against the expected one, and what it cost."""

    name: str
    title: str
    question: str
    expected: str
    answer: str
    correct: bool
    context_tokens: int
    """Tokens of the conversation as the model saw it (notices instead of payloads)."""
    inline_tokens: int
    """Tokens of the same conversation with every tool result inline."""
    seconds: float
    transcript: list[dict[str, Any]]
    """The history in the Chat Completions shape, final answer included."""

    @property
    def saving(self) -> float:
        """How many times fewer tokens the model used than inline."""
        return self.inline_tokens / max(self.context_tokens, 1)


# Scenario 1: a repository API answering with hundreds of pull requests with long bodies.

# (handle, weight, chance that a pull request of theirs is a bug fix): the most prolific
# author is not the one with the most merged bug fixes, so a count that ignores a filter
# gives a wrong answer.
_PR_AUTHORS = (
    ("mhernandez", 14, 0.15),
    ("a-okafor", 10, 0.45),
    ("jlindqvist", 9, 0.35),
    ("priya-n", 8, 0.40),
    ("tkowalski", 7, 0.30),
    ("sato-k", 6, 0.25),
    ("dbrennan", 5, 0.50),
    ("rfaye", 4, 0.20),
    ("lwong", 3, 0.30),
    ("ezra-m", 2, 0.60),
)
_PR_LABELS = ("enhancement", "docs", "performance", "security", "ci", "refactor", "dependencies")
_PR_AREAS = (
    "parser",
    "HTTP client",
    "retry policy",
    "cache layer",
    "CLI",
    "migrations",
    "auth middleware",
    "scheduler",
    "metrics exporter",
    "config loader",
)
_PR_TOPICS = (
    "handle partial failures",
    "stop swallowing the original error",
    "deflake the test suite",
    "clearer error messages",
    "drop deprecated helpers",
    "support non-ASCII input",
    "lock shared state",
)
_PR_SENTENCES = (
    "This change reworks how the {area} handles partial failures so callers see one clear error.",
    "Previously the {area} swallowed the original exception and logged a generic message instead.",
    "The new code path is covered by unit tests and by an integration test against a live server.",
    "I measured the hot path before and after and saw no regression on the benchmark suite.",
    "Reviewers should look closely at the locking around the shared state in the {area}.",
    "The old behaviour is kept behind a feature flag for one release so users can opt out.",
    "Documentation for the {area} has been updated, including the upgrade notes.",
    "A follow-up will remove the deprecated helpers once downstream projects have migrated.",
    "The flaky test in the {area} suite depended on wall-clock time; it now uses a fake clock.",
    "Error messages now name the setting involved and say how to fix it.",
    "This also bumps the minimum supported version, which the changelog mentions.",
    "Edge cases with empty input, very long input and non-ASCII input are handled explicitly.",
)


_PR_HANDLES = [a[0] for a in _PR_AUTHORS]
_PR_WEIGHTS = [a[1] for a in _PR_AUTHORS]
_PR_BUG_RATE = {a[0]: a[2] for a in _PR_AUTHORS}
_PR_START = datetime(2024, 1, 1, tzinfo=UTC)


def pull_requests(seed: int = 7, count: int = 400) -> Scenario:
    """A repository API returning every pull request, each with a ~150-word body."""
    rng = random.Random(seed)
    prs = [_pull_request(rng, i) for i in range(count)]
    merged_bugs = Counter(
        p["author"] for p in prs if p["state"] == "merged" and "bug" in p["labels"]
    )
    # Ties go to the name first in alphabetical order, as in the query's ORDER BY.
    top, top_count = min(merged_bugs.items(), key=lambda kv: (-kv[1], kv[0]))

    def phrase(author: str, merged: int) -> str:
        return f"{author}, with {merged} merged pull requests labelled 'bug'"

    return Scenario(
        name="pull_requests",
        title=f"Repository API: {count} pull requests with long bodies",
        tool=_json_tool(
            "list_pull_requests",
            "List a repository's pull requests (all states), with labels and full bodies.",
            {"repo": {"type": "string"}, "state": {"type": "string", "enum": ["all", "open"]}},
            prs,
        ),
        arguments={"repo": "acme/widgets", "state": "all"},
        question="Which author has the most merged pull requests labelled 'bug'?",
        sql=(
            "SELECT author, count(*) AS merged_bugs\n"
            'FROM "{table}"\n'
            "WHERE state = 'merged' AND list_contains(labels, 'bug')\n"
            "GROUP BY author\n"
            "ORDER BY merged_bugs DESC, author\n"
            "LIMIT 1"
        ),
        answer=lambda row: phrase(row["author"], int(row["merged_bugs"])),
        expected=phrase(top, top_count),
    )


def _pull_request(rng: random.Random, i: int) -> dict[str, Any]:
    """The i-th pull request: its author by weight, a bug fix at the author's rate."""
    author = rng.choices(_PR_HANDLES, _PR_WEIGHTS)[0]
    area = rng.choice(_PR_AREAS)
    is_bug = rng.random() < _PR_BUG_RATE[author]
    labels = (["bug"] if is_bug else []) + rng.sample(_PR_LABELS, rng.randint(0, 2))
    created = _PR_START + timedelta(minutes=rng.randrange(2 * 365 * 24 * 60))
    state = rng.choices(("merged", "closed", "open"), (6, 2, 2))[0]
    words: list[str] = []
    while len(words) < 150:
        words += rng.choice(_PR_SENTENCES).format(area=area).split()
    return {
        "number": 1200 + i,
        "title": f"{'Fix' if is_bug else 'Improve'} {area}: {rng.choice(_PR_TOPICS)}",
        "author": author,
        "state": state,
        "labels": labels,
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "comments": rng.randint(0, 30),
        "body": " ".join(words),
    }


# Scenario 2: a metrics API answering with whole time series.

_HOSTS = ("api-1", "api-2", "api-3", "db-1", "db-2", "cache-1")
_DAY = datetime(2025, 6, 3, tzinfo=UTC)
_MINUTES = 24 * 60


def metrics(seed: int = 11) -> Scenario:
    """A metrics API returning a day of 1-minute cpu and latency points for every host."""
    rng = random.Random(seed)
    # One host has a single huge spike (the highest peak overall), another a sustained
    # incident (the highest p99): the question asks for p99, so max() alone misleads.
    spiky, degraded = rng.sample(_HOSTS, 2)
    spike_minute = rng.randrange(_MINUTES)
    incident_start = rng.randrange(60, _MINUTES - 120)
    series: list[dict[str, Any]] = []
    for host in _HOSTS:
        base = rng.uniform(20, 60)
        spike = spike_minute if host == spiky else None
        incident = incident_start if host == degraded else None
        points = [_point(rng, minute, base, spike, incident) for minute in range(_MINUTES)]
        series.append({"host": host, "resolution_seconds": 60, "points": points})
    worst = min(series, key=lambda s: (-_p99_latency(s), s["host"]))
    peak = min(worst["points"], key=lambda p: (-p["latency_ms"], p["ts"]))

    def phrase(host: str, p99_ms: float, peak_minute: str, peak_ms: float) -> str:
        return f"{host} (p99 {p99_ms:.1f} ms), peak {peak_ms:.1f} ms at {peak_minute} UTC"

    return Scenario(
        name="metrics",
        title=f"Metrics API: {len(_HOSTS)} hosts x 1 day at 1-minute resolution",
        tool=_json_tool(
            "query_metrics",
            "Fetch time series (cpu %, latency_ms) for hosts over a time range.",
            _METRICS_PARAMETERS,
            series,
        ),
        arguments=_METRICS_ARGUMENTS,
        question=(
            "Which host had the highest p99 latency on 2025-06-03, "
            "and at what minute was that host's latency peak?"
        ),
        sql=_METRICS_SQL,
        answer=lambda row: phrase(
            row["host"], float(row["p99_ms"]), row["peak_minute"], float(row["peak_ms"])
        ),
        expected=phrase(worst["host"], _p99_latency(worst), peak["ts"][11:16], peak["latency_ms"]),
    )


_METRICS_PARAMETERS = {
    "hosts": {"type": "string"},
    "metrics": {"type": "array", "items": {"type": "string"}},
    "from": {"type": "string"},
    "to": {"type": "string"},
    "step": {"type": "string"},
}
_METRICS_ARGUMENTS = {
    "hosts": "*",
    "metrics": ["cpu", "latency_ms"],
    "from": "2025-06-03T00:00:00Z",
    "to": "2025-06-04T00:00:00Z",
    "step": "1m",
}
_METRICS_SQL = (
    "WITH points AS (\n"
    "  SELECT s.host, p.ts, p.latency_ms\n"
    '  FROM "{table}" AS s, UNNEST(s.points) AS u(p)\n'
    "), worst AS (\n"
    "  SELECT host, quantile_disc(latency_ms, 0.99) AS p99_ms\n"
    "  FROM points GROUP BY host\n"
    "  ORDER BY p99_ms DESC, host LIMIT 1\n"
    ")\n"
    "SELECT host, p99_ms, strftime(ts, '%H:%M') AS peak_minute, latency_ms AS peak_ms\n"
    "FROM worst JOIN points USING (host)\n"
    "ORDER BY latency_ms DESC, ts\n"
    "LIMIT 1"
)
"""The query the scripted model writes: the host of the highest p99, then its peak."""


def _point(
    rng: random.Random, minute: int, base: float, spike: int | None, incident: int | None
) -> dict[str, Any]:
    """One host's point at a minute of the day: a daily cpu curve with noise, latency
    following it; 45 minutes of incident from `incident`, one spike at minute `spike`."""
    daily = math.sin((minute - 8 * 60) / _MINUTES * 2 * math.pi)
    cpu = min(100.0, max(0.0, 35 + 25 * daily + rng.gauss(0, 6)))
    latency = base * (1 + cpu / 120) * rng.lognormvariate(0, 0.25)
    if incident is not None and incident <= minute < incident + 45:
        latency += rng.uniform(350, 650)
    if minute == spike:
        latency = 2400 + rng.uniform(0, 200)
    return {
        "ts": (_DAY + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu": round(cpu, 1),
        "latency_ms": round(latency, 1),
    }


def _p99_latency(series: Mapping[str, Any]) -> float:
    """A host's p99 latency, nearest rank, as DuckDB's quantile_disc computes it: always a
    measured value."""
    ordered = sorted(p["latency_ms"] for p in series["points"])
    return float(ordered[math.ceil(len(ordered) * 0.99) - 1])


# Scenario 3: a CRM search answering with accounts, their contacts and their histories.

_COMPANY_FIRST = (
    "Northwind",
    "Bluefin",
    "Cobalt",
    "Evergreen",
    "Granite",
    "Harbor",
    "Ironwood",
    "Juniper",
    "Keystone",
    "Lumen",
    "Meridian",
    "Nimbus",
    "Orchid",
    "Pioneer",
    "Quarry",
    "Redwood",
    "Summit",
    "Tidewater",
    "Vantage",
    "Willow",
)
_COMPANY_SECOND = (
    "Logistics",
    "Health",
    "Foods",
    "Analytics",
    "Energy",
    "Robotics",
    "Media",
    "Capital",
    "Labs",
    "Retail",
    "Systems",
    "Travel",
)
_OWNERS = (
    "Maya Chen",
    "Luis Ortega",
    "Hannah Berg",
    "Kofi Mensah",
    "Sofia Rossi",
    "Arjun Patel",
    "Emma Novak",
)
_FIRST_NAMES = ("Alex", "Sam", "Jordan", "Taylor", "Morgan", "Riley", "Casey", "Jamie", "Avery")
_LAST_NAMES = ("Smith", "Garcia", "Kim", "Müller", "Dubois", "Tanaka", "Silva", "Okoro", "Lund")
_TITLES = ("CTO", "VP Operations", "Head of IT", "Procurement", "Engineering Manager", "CFO")
_TICKET_SUBJECTS = (
    "Sync job stuck for hours",
    "SSO login loop after upgrade",
    "Invoice totals do not match the export",
    "API returns 502 under load",
    "Missing records after import",
    "Dashboard shows stale data",
)
_OTHER_EVENTS = {
    "call": ("Quarterly business review", "Renewal discussion", "Roadmap walkthrough"),
    "meeting": ("Onsite workshop", "Executive sponsor meeting", "Training session"),
    "email": ("Sent the updated price sheet", "Shared the migration guide", "Follow-up on pilot"),
}


def crm_search(seed: int = 23, count: int = 200) -> Scenario:
    """A CRM search returning accounts, each with nested contacts and a history of events."""
    rng = random.Random(seed)
    names = rng.sample(
        [f"{a} {b}" for a in _COMPANY_FIRST for b in _COMPANY_SECOND],
        count,
    )
    # One account had a very bad 2024 and a quiet 2025: the question asks about 2025,
    # so counting escalations in every year gives a wrong answer.
    bad_2024 = rng.randrange(count)
    accounts = [_account(rng, i, name, i == bad_2024) for i, name in enumerate(names)]
    top = min(accounts, key=lambda a: (-_escalated_2025(a), a["name"]))

    def phrase(account: str, escalated: int, owner: str) -> str:
        return f"{account} ({escalated} escalated tickets in 2025), owned by {owner}"

    return Scenario(
        name="crm_search",
        title=f"CRM search: {count} accounts with nested contacts and histories",
        tool=_json_tool(
            "search_accounts",
            "Search CRM accounts; each comes with its contacts and its full history.",
            {
                "query": {"type": "string"},
                "include": {"type": "array", "items": {"type": "string"}},
            },
            accounts,
        ),
        arguments={"query": "*", "include": ["contacts", "history"]},
        question="Which account had the most escalated tickets in 2025, and who owns it?",
        sql=(
            "SELECT a.name AS account, count(*) AS escalated, a.owner.name AS owner\n"
            'FROM "{table}" AS a, UNNEST(a.history) AS h(e)\n'
            "WHERE e.type = 'ticket' AND e.escalated\n"
            "  AND e.date BETWEEN DATE '2025-01-01' AND DATE '2025-12-31'\n"
            "GROUP BY ALL\n"
            "ORDER BY escalated DESC, account\n"
            "LIMIT 1"
        ),
        answer=lambda row: phrase(row["account"], int(row["escalated"]), row["owner"]),
        expected=phrase(top["name"], _escalated_2025(top), top["owner"]["name"]),
    )


def _account(rng: random.Random, i: int, name: str, bad_2024: bool) -> dict[str, Any]:
    """The i-th account: its history, its contacts, then its own fields (drawn in that
    order, which fixes the seed's data)."""
    history = _account_history(rng, bad_2024)
    contacts = _account_contacts(rng, name)
    return {
        "id": f"ACC-{10000 + i}",
        "name": name,
        "tier": rng.choice(("startup", "mid-market", "enterprise")),
        "owner": {"name": rng.choice(_OWNERS), "team": "EMEA"},
        "arr_usd": rng.randrange(5_000, 900_000, 500),
        "contacts": contacts,
        "history": history,
    }


def _account_history(rng: random.Random, bad_2024: bool) -> list[dict[str, Any]]:
    """Tickets, calls, meetings and emails over 2024 and 2025, oldest first; an account
    with a bad 2024 escalated nearly every ticket of that year, and one more each month."""
    trouble = rng.uniform(0.05, 0.45)
    history: list[dict[str, Any]] = []
    for _ in range(rng.randint(6, 24)):
        day = date(2024, 1, 1) + timedelta(days=rng.randrange(731))
        kind = rng.choices(("ticket", "call", "meeting", "email"), (4, 2, 1, 3))[0]
        if kind != "ticket":
            subject = rng.choice(_OTHER_EVENTS[kind])
            history.append({"type": kind, "date": day.isoformat(), "subject": subject})
            continue
        year_trouble = 0.9 if bad_2024 and day.year == 2024 else trouble
        history.append(
            {
                "type": "ticket",
                "date": day.isoformat(),
                "subject": rng.choice(_TICKET_SUBJECTS),
                "priority": rng.choice(("low", "normal", "high", "urgent")),
                "status": rng.choice(("open", "pending", "solved")),
                "escalated": rng.random() < year_trouble,
            }
        )
    if bad_2024:
        history += [
            {
                "type": "ticket",
                "date": f"2024-{month:02d}-15",
                "subject": rng.choice(_TICKET_SUBJECTS),
                "priority": "urgent",
                "status": "solved",
                "escalated": True,
            }
            for month in range(1, 13)
        ]
    history.sort(key=lambda e: str(e["date"]))
    return history


def _account_contacts(rng: random.Random, name: str) -> list[dict[str, str]]:
    contacts = []
    for _ in range(rng.randint(2, 6)):
        first, last = rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES)
        domain = name.lower().replace(" ", "")
        contacts.append(
            {
                "name": f"{first} {last}",
                "title": rng.choice(_TITLES),
                "email": f"{first.lower()}.{last.lower()}@{domain}.example",
            }
        )
    return contacts


def _escalated_2025(account: Mapping[str, Any]) -> int:
    return sum(
        1
        for e in account["history"]
        if e["type"] == "ticket" and e["escalated"] and e["date"].startswith("2025-")
    )


def scenarios() -> list[Scenario]:
    """The demo's scenarios, in the order it runs them."""
    return [pull_requests(), metrics(), crm_search()]


def _json_tool(
    name: str, description: str, properties: Mapping[str, Any], data: object
) -> UserTool:
    """A user tool that answers any call with the whole payload, as such APIs do."""
    payload = json.dumps(data, ensure_ascii=False)
    spec = ToolSpec(name, description, {"type": "object", "properties": dict(properties)})
    return UserTool(spec, lambda _arguments: payload)


# The scripted model: reads the history the way a model would, one decision per turn.


def scripted_model(scenario: Scenario) -> ScriptedModel:
    """A model that calls the scenario's tool, queries the offloaded result, and answers."""
    tool_name = scenario.tool.spec.name

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        last = messages[-1]
        if last["role"] != "tool":
            return Turn(tool_calls=(ToolCall("call_1", tool_name, scenario.arguments),))
        content = str(last["content"])
        if _called_tool(messages, str(last["tool_call_id"])) == tool_name:
            notice = parse_notice(content)
            if notice is None:
                # The payloads are sized to always be offloaded; an inline result means the
                # gate let it through, which is worth failing loudly over.
                return Turn(text="the tool result came back inline, not as a notice")
            # The notice's path names the file; SQL knows it as a table named by its stem.
            table = PurePosixPath(notice["path"]).stem
            code = scenario.sql.format(table=table.replace('"', '""'))
            return Turn(
                tool_calls=(ToolCall("call_2", SANDBOX_EXEC, {"lang": "sql", "code": code}),)
            )
        output = json.loads(content)
        if output.get("exit_code") != 0:
            return Turn(text=f"the query failed: {output.get('stderr') or output.get('error')}")
        rows = list(csv.DictReader(io.StringIO(output["output"])))
        if not rows:
            return Turn(text="the query found no rows")
        return Turn(text=scenario.answer(rows[0]))

    return ScriptedModel(script)


def _called_tool(messages: Sequence[Mapping[str, Any]], call_id: str) -> str | None:
    """The name of the tool that the assistant called with this id."""
    for message in messages:
        for call in message.get("tool_calls") or ():
            if call["id"] == call_id:
                return str(call["function"]["name"])
    return None


def run_scenario(task: Task, scenario: Scenario) -> ScenarioResult:
    """Run one scenario in a task's sandbox with the scripted model and check its answer."""
    result = run(task, scripted_model(scenario), scenario.question, tools=[scenario.tool])
    return ScenarioResult(
        name=scenario.name,
        title=scenario.title,
        question=scenario.question,
        expected=scenario.expected,
        answer=result.answer,
        correct=result.answer == scenario.expected,
        context_tokens=result.context_tokens,
        inline_tokens=result.inline_tokens,
        seconds=result.seconds,
        transcript=result.messages,
    )


def run_demo(
    home: str | None = None,
    chosen: Sequence[Scenario] | None = None,
    console: Console | None = None,
) -> int:
    """Run the scenarios in real sandboxes, print transcripts and tables; 0 if all correct.

    home=None runs in a temporary home, removed after. Each scenario gets its own task,
    deleted when it is done.
    """
    console = console or Console()
    chosen = scenarios() if chosen is None else chosen
    client = connect()
    try:
        with console.status("checking the sandbox image") as status:
            ensure_image(
                client,
                progress=lambda event: status.update(
                    f"building the sandbox image: {event.step}: {event.text[:100]}"
                ),
            )
    finally:
        client.close()
    results = []
    with _home(home) as path:
        harness = Harness(sandbox="docker", home=path, gc_interval=-1)
        try:
            for scenario in chosen:
                # A fresh id each run: a reused --home may still hold a task from a run
                # that was interrupted before it could delete its task.
                task = harness.task(f"demo-{scenario.name}-{secrets.token_hex(4)}")
                try:
                    result = run_scenario(task, scenario)
                finally:
                    task.close(delete=True)
                print_transcript(console, result)
                console.print(scenario_table(result))
                results.append(result)
        finally:
            harness.close()
    if len(results) > 1:
        console.print(summary_table(results))
    return 0 if all(r.correct for r in results) else 1


def run_example(scenario: Callable[[], Scenario], argv: Sequence[str] | None = None) -> int:
    """The command line of an example script: run one scenario (see examples/)."""
    parser = argparse.ArgumentParser(description=f"spillbox example: {scenario.__doc__}")
    parser.add_argument("--home", help="spillbox home (default: a temp folder, removed after)")
    args = parser.parse_args(argv)
    try:
        return run_demo(home=args.home, chosen=[scenario()])
    except SpillboxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


@contextmanager
def _home(home: str | None) -> Iterator[Path]:
    if home is not None:
        yield Path(home)
        return
    with tempfile.TemporaryDirectory(prefix="spillbox-demo-") as path:
        yield Path(path)


# Printing: what the model saw, step by step, then what it cost.


def print_transcript(console: Console, result: ScenarioResult) -> None:
    """The conversation as the model saw it: notices whole, other results cut short."""
    console.rule(Text(result.title, style="bold"))
    for message in result.transcript:
        role = message["role"]
        content = str(message.get("content") or "")
        if role == "user":
            console.print(Panel(Text(content), title="user", title_align="left", style="cyan"))
        elif role == "assistant" and message.get("tool_calls"):
            for call in message["tool_calls"]:
                console.print(_call_view(call["function"]["name"], call["function"]["arguments"]))
        elif role == "assistant":
            console.print(Panel(Text(content), title="answer", title_align="left", style="green"))
        elif role == "tool":
            console.print(_result_view(content))


def _call_view(name: str, arguments: str) -> Group:
    args = json.loads(arguments)
    code = args.pop("code", None) if isinstance(args, dict) else None
    shown = _shorten(json.dumps(args, ensure_ascii=False), SHOWN_ARGUMENT_CHARS)
    head = Text.assemble(("assistant → ", "bold magenta"), (name, "bold"), " ", shown)
    if not isinstance(code, str):
        return Group(head)
    lines = code.splitlines()
    if len(lines) > SHOWN_CODE_LINES:
        lines = [*lines[:SHOWN_CODE_LINES], f"-- … {len(lines) - SHOWN_CODE_LINES} more lines"]
    lexer = "sql" if args.get("lang") == "sql" else str(args.get("lang") or "text")
    return Group(head, Syntax("\n".join(lines), lexer, padding=(0, 2), word_wrap=True))


def _result_view(content: str) -> Panel:
    if parse_notice(content) is not None:
        return Panel(
            Text(content),
            title="tool result, offloaded: the model sees this notice",
            title_align="left",
            style="yellow",
        )
    lines = content.splitlines()
    shown = "\n".join(lines[:SHOWN_RESULT_LINES])
    if len(lines) > SHOWN_RESULT_LINES:
        shown += f"\n… {len(lines) - SHOWN_RESULT_LINES} more lines"
    return Panel(
        Text(_shorten(shown, SHOWN_RESULT_CHARS)),
        title="tool result, inline",
        title_align="left",
    )


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def scenario_table(result: ScenarioResult) -> Table:
    """One scenario: tokens inline against with spillbox, the answer, whether it is right."""
    table = Table(title=result.title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("question", result.question)
    table.add_row("tokens, every result inline", f"{result.inline_tokens:,}")
    table.add_row("tokens, with spillbox", f"{result.context_tokens:,}")
    table.add_row("saving", f"{result.saving:,.0f}x fewer tokens")
    table.add_row("answer found", result.answer)
    table.add_row("expected", result.expected)
    table.add_row("correct", _verdict(result.correct))
    table.add_row("time", f"{result.seconds:.1f} s")
    return table


def summary_table(results: Sequence[ScenarioResult]) -> Table:
    """Every scenario in one row each: tokens inline vs with spillbox, correct, time."""
    table = Table(title="spillbox demo: summary", title_justify="left")
    table.add_column("scenario")
    table.add_column("inline tokens", justify="right")
    table.add_column("with spillbox", justify="right")
    table.add_column("saving", justify="right")
    table.add_column("correct")
    table.add_column("time", justify="right")
    for r in results:
        table.add_row(
            r.name,
            f"{r.inline_tokens:,}",
            f"{r.context_tokens:,}",
            f"{r.saving:,.0f}x",
            _verdict(r.correct),
            f"{r.seconds:.1f} s",
        )
    return table


def _verdict(correct: bool) -> Text:
    return Text("yes", style="bold green") if correct else Text("NO", style="bold red")
