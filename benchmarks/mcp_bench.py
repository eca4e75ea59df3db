"""MCP proxy benchmark: what `spillbox mcp proxy` adds to a call, against calling the
server directly, in one run.

The upstream is tests/mcp/toy_server.py, a server of the official SDK's own, and both
sides are driven by the SDK's ClientSession over stdio, so the floor is the SDK's:

- pass-through latency: a small `echo` call (a few bytes, inline), called directly and
  through the proxy in alternation; median and p99 of each, and what the proxy adds; and
  the median again with a 2026-07-28 client (the SDK's Client, both sides stateless);
- a 40 MB result: the server's own time to send it (a raw client writes the request and
  reads the reply's line, parsing nothing) against the call through the proxy (received,
  parsed, gated, stored, and the notice returned); the SDK's own client, calling the
  server directly, is shown too;
- memory: a fresh proxy's peak RSS (VmHWM) over one 100 MB result, against the payload's
  size, and what the call added to the RSS it had before; and a proxy's RSS at idle
  (initialized, its tools listed, no call yet);
- beside PyPI's mcp-proxy (the most used Python MCP proxy), in front of the same upstream
  and driven by the same SDK client over streamable HTTP: the echo call's median through
  each, against the direct stdio call, and each one's RSS at idle. mcp-proxy 0.13 needs
  mcp<2, so it lives in a venv of its own: name its executable in SPILLBOX_BENCH_MCP_PROXY
  (python -m venv V && V/bin/pip install mcp-proxy==0.13.0); without it, spillbox alone.
  Beside them a bare proxy on spillbox's own SDK (bare_proxy.py), what that SDK's server
  and client cost with nothing else (its answers on SSE streams, the SDK's default): it
  tells what spillbox adds from what its SDK costs.

Targets: the median added to a small call under 2 ms over stdio (issue 10, item 7); over
streamable HTTP at most what mcp-proxy adds, idle RSS at most 80 MiB, and a 100 MB
result's peak RSS growth at most 2x its size (issue 24, items 6 and 8).

    python benchmarks/mcp_bench.py           # full run, a few minutes
    python benchmarks/mcp_bench.py --quick   # a smoke run: fewer calls, 4 MB and 10 MB
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import LATEST_MODERN_VERSION

from common import MB, Target, bench_main
from mcp import Client
from spillbox import parse_notice

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "mcp" / "toy_server.py"
SPILLBOX = Path(sys.executable).parent / "spillbox"
BARE_PROXY = Path(__file__).resolve().parent / "bare_proxy.py"
BARE = "bare proxy on spillbox's SDK"
"""bare_proxy.py: the SDK's own server and client passing calls through, nothing else."""
SMALL_TEXT = "hello from the upstream"
SMALL_CALLS = 400
QUICK_SMALL_CALLS = 60
WARMUP_CALLS = 20
LARGE_BYTES = 40 * MB
QUICK_LARGE_BYTES = 4 * MB
LARGE_RUNS = 3
MEMORY_BYTES = 100 * MB
QUICK_MEMORY_BYTES = 10 * MB
ADDED_MS_MAX = 2.0
IDLE_MIB_MAX = 80
GROWTH_MAX = 2.0
START_TIMEOUT = "120"
"""The upstream's start timeout given to both proxies: load room on a shared machine."""
MCP_PROXY = os.environ.get("SPILLBOX_BENCH_MCP_PROXY")


def _direct() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(SERVER)])


def _proxied(home: str) -> StdioServerParameters:
    args = ["mcp", "proxy", *_spillbox_flags(home)]
    return StdioServerParameters(
        command=str(SPILLBOX), args=[*args, "--", sys.executable, str(SERVER)]
    )


def _spillbox_flags(home: str) -> list[str]:
    return [
        *("--home", home, "--sandbox", "none", "--keep-after-close", "0"),
        *("--upstream-start-timeout", START_TIMEOUT),
    ]


@asynccontextmanager
async def _session(params: StdioServerParameters, era: str = "legacy") -> AsyncIterator[Any]:
    """A connected client: the SDK's ClientSession after the 2025-11-25 handshake
    (legacy), or its Client in a 2026-07-28 mode (both sides stateless)."""
    if era != "legacy":
        async with Client(params, mode=era) as client:
            yield client
        return
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _timed_call(session: Any, tool: str, args: dict[str, Any]) -> float:
    started = time.perf_counter()
    result = await session.call_tool(tool, args)
    seconds = time.perf_counter() - started
    if result.is_error:
        raise RuntimeError(f"{tool} failed: {result.content}")
    return seconds


def _ms(samples: list[float], pick: Callable[[list[float]], float]) -> float:
    return pick(sorted(samples)) * 1000


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


def _p99(samples: list[float]) -> float:
    return samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]


async def _small(home: str, calls: int, era: str = "legacy") -> dict[str, Any]:
    """The echo call, direct and proxied in alternation (load moves both alike), with the
    client of the era given (the proxy speaks to the server in the era it speaks)."""
    args = {"text": SMALL_TEXT}
    direct: list[float] = []
    proxied: list[float] = []
    async with _session(_direct(), era) as server, _session(_proxied(home), era) as proxy:
        for _ in range(WARMUP_CALLS):
            await _timed_call(server, "echo", args)
            await _timed_call(proxy, "echo", args)
        for _ in range(calls):
            direct.append(await _timed_call(server, "echo", args))
            proxied.append(await _timed_call(proxy, "echo", args))
    return {
        "calls": calls,
        "direct_median_ms": _ms(direct, _median),
        "proxy_median_ms": _ms(proxied, _median),
        "direct_p99_ms": _ms(direct, _p99),
        "proxy_p99_ms": _ms(proxied, _p99),
    }


async def _raw_ms(size: int, runs: int) -> float:
    """The server's own time to send a result of size bytes: the median time from writing
    the request to holding the reply's whole line, read by a client that parses nothing."""
    initialize = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    }
    async with await anyio.open_process([sys.executable, str(SERVER)]) as process:
        assert process.stdin is not None and process.stdout is not None
        stdin, replies = process.stdin, BufferedByteReceiveStream(process.stdout)

        async def send(message: dict[str, Any]) -> None:
            await stdin.send(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

        await send({"id": 0, "method": "initialize", "params": initialize})
        await replies.receive_until(b"\n", 2**20)
        await send({"method": "notifications/initialized"})
        times = []
        for n in range(1, runs + 1):
            started = time.perf_counter()
            call = {"name": "blob", "arguments": {"size": size}}
            await send({"id": n, "method": "tools/call", "params": call})
            reply = await replies.receive_until(b"\n", 2 * size + 2**20)
            times.append(time.perf_counter() - started)
            assert len(reply) > size
        await stdin.aclose()
    return _ms(times, _median)


async def _large(home: str, size: int) -> dict[str, Any]:
    """One result of size bytes: the raw floor, the SDK client direct, and proxied."""
    args = {"size": size}
    raw_ms = await _raw_ms(size, LARGE_RUNS)
    async with _session(_direct()) as server, _session(_proxied(home)) as proxy:
        direct = [await _timed_call(server, "blob", args) for _ in range(LARGE_RUNS)]
        proxied = [await _timed_call(proxy, "blob", args) for _ in range(LARGE_RUNS)]
        check = await proxy.call_tool("blob", args)
    text = "".join(b.text for b in check.content if isinstance(b, types.TextContent))
    notice = parse_notice(text)
    return {
        "bytes": size,
        "runs": LARGE_RUNS,
        "raw_ms": raw_ms,
        "direct_ms": _ms(direct, _median),
        "proxy_ms": _ms(proxied, _median),
        "offloaded": notice is not None,
    }


async def _memory(home: str, size: int) -> dict[str, Any]:
    """A fresh proxy's RSS before one result of size bytes and its peak after."""
    async with _session(_proxied(home)) as proxy:
        pid = _proxy_pid()
        await proxy.list_tools()
        idle = _status_kb(pid, "VmRSS")
        await _timed_call(proxy, "echo", {"text": SMALL_TEXT})
        before = _status_kb(pid, "VmRSS")
        await _timed_call(proxy, "blob", {"size": size})
        peak = _status_kb(pid, "VmHWM")
    return {"bytes": size, "idle": idle * 1024, "rss_before": before * 1024, "peak": peak * 1024}


@asynccontextmanager
async def _over_http(url: str) -> AsyncIterator[Any]:
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def _serving(command: list[str], url: str | None = None) -> tuple[subprocess.Popen[str], str]:
    """A proxy serving streamable HTTP, started; its URL (url, or the one spillbox prints
    on its first stderr line). Its stderr is read on, so that it never blocks."""
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    stderr = server.stderr
    if url is None:
        found = re.search(r"http://\S+/mcp", stderr.readline())
        assert found, "spillbox printed no URL"
        url = found.group(0)
    threading.Thread(target=stderr.read, daemon=True).start()
    return server, url


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _answering(url: str) -> None:
    """Wait (at most a minute: load room) until a server accepts connections at url."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    for _ in range(600):
        try:
            stream = await anyio.connect_tcp(host, int(port))
        except OSError:
            await anyio.sleep(0.1)
            continue
        await stream.aclose()
        return
    raise RuntimeError(f"nothing answers at {url}")


def _http_proxies(home: str) -> list[tuple[str, list[str], str | None]]:
    """(name, command, URL or None: printed) of each proxy measured over HTTP."""
    upstream = [sys.executable, str(SERVER)]
    listen = ["--listen", "127.0.0.1:0"]
    proxies: list[tuple[str, list[str], str | None]] = [
        (
            "spillbox",
            [str(SPILLBOX), "mcp", "proxy", *_spillbox_flags(home), *listen, "--", *upstream],
            None,
        )
    ]
    port = _free_port()
    command = [sys.executable, str(BARE_PROXY), str(port), "--", *upstream]
    proxies.append((BARE, command, f"http://127.0.0.1:{port}/mcp"))
    if MCP_PROXY:
        port = _free_port()
        command = [MCP_PROXY, "--host", "127.0.0.1", "--port", str(port), "--", *upstream]
        proxies.append(("mcp-proxy", command, f"http://127.0.0.1:{port}/mcp"))
    return proxies


async def _http(home: str, calls: int) -> dict[str, Any]:
    """The echo call over streamable HTTP through each proxy and directly over stdio, in
    rotation (load moves all alike); each proxy's RSS at idle, after initialize."""
    args = {"text": SMALL_TEXT}
    results: dict[str, Any] = {}
    started = [(name, *_serving(command, url)) for name, command, url in _http_proxies(home)]
    try:
        for _, _, url in started:
            await _answering(url)
        async with AsyncExitStack() as stack:
            direct = await stack.enter_async_context(_session(_direct()))
            sessions = [await stack.enter_async_context(_over_http(url)) for _, _, url in started]
            for (name, server, _), session in zip(started, sessions, strict=True):
                await session.list_tools()
                results[name] = {"idle": _status_kb(server.pid, "VmRSS") * 1024, "times": []}
            # The SDK's Client in its default era, which only spillbox of the three speaks.
            modern = await stack.enter_async_context(
                Client(started[0][2], mode=LATEST_MODERN_VERSION)
            )
            times: list[float] = []
            modern_times: list[float] = []
            for n in range(WARMUP_CALLS + calls):
                took = await _timed_call(direct, "echo", args)
                if n >= WARMUP_CALLS:
                    times.append(took)
                for (name, _, _), session in zip(started, sessions, strict=True):
                    took = await _timed_call(session, "echo", args)
                    if n >= WARMUP_CALLS:
                        results[name]["times"].append(took)
                took = await _timed_call(modern, "echo", args)
                if n >= WARMUP_CALLS:
                    modern_times.append(took)
    finally:
        for _, server, _ in started:
            server.terminate()
            server.wait(timeout=60)
    direct_ms = _ms(times, _median)
    return {
        "calls": calls,
        "direct_median_ms": direct_ms,
        "modern_median_ms": _ms(modern_times, _median),
        "proxies": {
            name: {"idle": r["idle"], "median_ms": _ms(r["times"], _median)}
            for name, r in results.items()
        },
    }


def _proxy_pid() -> int:
    """The spillbox process among this process's children (the proxy; its upstream is a
    grandchild)."""
    for tasks in Path("/proc/self/task").iterdir():
        for child in (tasks / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spillbox" in cmdline and b"proxy" in cmdline:
                return int(child)
    raise RuntimeError("the proxy process was not found")


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


async def _run(quick: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="spillbox-bench-") as home:
        return {
            "small": await _small(home, QUICK_SMALL_CALLS if quick else SMALL_CALLS),
            "small_2026": await _small(
                home, QUICK_SMALL_CALLS if quick else SMALL_CALLS, LATEST_MODERN_VERSION
            ),
            "large": await _large(home, QUICK_LARGE_BYTES if quick else LARGE_BYTES),
            "memory": await _memory(home, QUICK_MEMORY_BYTES if quick else MEMORY_BYTES),
            "http": await _http(home, QUICK_SMALL_CALLS if quick else SMALL_CALLS),
        }


def run(quick: bool = False) -> dict[str, Any]:
    """Measure the three in one run."""
    results: dict[str, Any] = anyio.run(_run, quick)
    return results


def markdown(results: dict[str, Any]) -> str:
    small, large, memory = results["small"], results["large"], results["memory"]
    modern = results["small_2026"]
    added = small["proxy_median_ms"] - small["direct_median_ms"]
    added_p99 = small["proxy_p99_ms"] - small["direct_p99_ms"]
    added_modern = modern["proxy_median_ms"] - modern["direct_median_ms"]
    mb = large["bytes"] // MB
    return "\n".join(
        [
            "| call | direct (ms) | through the proxy (ms) | added (ms) | ratio (proxy/direct) |",
            "|---|---:|---:|---:|---:|",
            f"| echo, median of {small['calls']} | {small['direct_median_ms']:.2f} | "
            f"{small['proxy_median_ms']:.2f} | {added:.2f} | "
            f"{small['proxy_median_ms'] / small['direct_median_ms']:.2f} |",
            f"| echo, p99 of {small['calls']} | {small['direct_p99_ms']:.2f} | "
            f"{small['proxy_p99_ms']:.2f} | {added_p99:.2f} | "
            f"{small['proxy_p99_ms'] / small['direct_p99_ms']:.2f} |",
            f"| echo, 2026-07-28 client, median of {modern['calls']} | "
            f"{modern['direct_median_ms']:.2f} | {modern['proxy_median_ms']:.2f} | "
            f"{added_modern:.2f} | "
            f"{modern['proxy_median_ms'] / modern['direct_median_ms']:.2f} |",
            f"| {mb} MB result, median of {large['runs']} (direct: the server's own time "
            f"to send it) | {large['raw_ms']:.0f} | {large['proxy_ms']:.0f} | "
            f"{large['proxy_ms'] - large['raw_ms']:.0f} | "
            f"{large['proxy_ms'] / large['raw_ms']:.2f} |",
            "",
            f"The {mb} MB result through the proxy was "
            f"{'offloaded' if large['offloaded'] else '**not offloaded**'}. The SDK's own "
            f"client calling the server directly took {large['direct_ms']:.0f} ms to "
            f"receive it whole ({large['direct_ms'] / large['raw_ms']:.2f}x the server's "
            "time: mcp 2.3.0's stdio client reads a line in time quadratic in its length; "
            "the proxy reads its upstream's lines in linear time).",
            "",
            f"Proxy memory over one {memory['bytes'] // MB} MB result: peak RSS "
            f"{memory['peak'] / MB:.0f} MB, {memory['peak'] / memory['bytes']:.2f}x the "
            f"payload; the call added {(memory['peak'] - memory['rss_before']) / MB:.0f} MB "
            f"({(memory['peak'] - memory['rss_before']) / memory['bytes']:.2f}x the payload) "
            f"to the {memory['rss_before'] / MB:.0f} MB it held before; at idle it held "
            f"{memory['idle'] / MB:.0f} MiB.",
            "",
            *_http_markdown(results["http"]),
        ]
    )


def _http_markdown(http: dict[str, Any]) -> list[str]:
    direct = http["direct_median_ms"]
    lines = [
        f"Over streamable HTTP, median of {http['calls']} echo calls (direct over stdio: "
        f"{direct:.2f} ms):",
        "",
        "| proxy | median (ms) | added (ms) | idle RSS (MiB) |",
        "|---|---:|---:|---:|",
    ]
    for name, measured in http["proxies"].items():
        added = measured["median_ms"] - direct
        lines.append(
            f"| {name} | {measured['median_ms']:.2f} | {added:.2f} | {measured['idle'] / MB:.0f} |"
        )
    modern = http["modern_median_ms"]
    lines += [
        "",
        f"spillbox with the SDK's Client in its default era (2026-07-28, which neither other "
        f"proxy speaks): median {modern:.2f} ms, {modern - direct:.2f} added.",
        "",
        f"The {BARE} (benchmarks/bare_proxy.py: the mcp {version('mcp')} SDK's own HTTP server "
        "in front, answering every POST on an SSE stream as that server does by default, and "
        "its stdio client behind, calls passed straight through) is what that SDK costs; "
        "mcp-proxy 0.13 runs on mcp<2 and answers every POST with one JSON body; spillbox "
        "answers with JSON when the answer comes alone, on SSE when something comes first. "
        f"What spillbox adds beyond the bare proxy: {_beyond_bare(http):.2f} ms.",
    ]
    if "mcp-proxy" not in http["proxies"]:
        lines += ["", "mcp-proxy was not measured: set SPILLBOX_BENCH_MCP_PROXY."]
    return lines


def _beyond_bare(http: dict[str, Any]) -> float:
    proxies = http["proxies"]
    return float(proxies["spillbox"]["median_ms"] - proxies[BARE]["median_ms"])


def targets(results: dict[str, Any]) -> list[Target]:
    small = results["small"]
    added = small["proxy_median_ms"] - small["direct_median_ms"]
    return [
        Target(
            goal=f"the proxy adds under {ADDED_MS_MAX:g} ms (median) to a small call",
            met=added < ADDED_MS_MAX,
            measured=f"{added:.2f} ms added: {small['proxy_median_ms']:.2f} ms against "
            f"{small['direct_median_ms']:.2f} ms direct, ratio "
            f"{small['proxy_median_ms'] / small['direct_median_ms']:.2f}",
        ),
        _growth_target(results["memory"]),
        _idle_target(results["memory"]),
        _http_target(results["http"]),
    ]


def _growth_target(memory: dict[str, Any]) -> Target:
    growth = (memory["peak"] - memory["rss_before"]) / memory["bytes"]
    return Target(
        goal=f"a large result grows the proxy's peak RSS at most {GROWTH_MAX:g}x its size",
        met=growth <= GROWTH_MAX if memory["bytes"] == MEMORY_BYTES else None,
        measured=f"{growth:.2f}x over one {memory['bytes'] // MB} MB result",
    )


def _idle_target(memory: dict[str, Any]) -> Target:
    idle = memory["idle"] / MB
    return Target(
        goal=f"the proxy idles at most at {IDLE_MIB_MAX} MiB RSS",
        met=idle <= IDLE_MIB_MAX,
        measured=f"{idle:.0f} MiB, {idle / IDLE_MIB_MAX:.2f}x the target",
    )


def _http_target(http: dict[str, Any]) -> Target:
    direct, proxies = http["direct_median_ms"], http["proxies"]
    ours = proxies["spillbox"]["median_ms"] - direct
    if "mcp-proxy" not in proxies:
        return Target(
            goal="over streamable HTTP spillbox adds at most what mcp-proxy adds",
            met=None,
            measured=f"{ours:.2f} ms added; mcp-proxy not measured",
        )
    theirs = proxies["mcp-proxy"]["median_ms"] - direct
    bare = proxies[BARE]["median_ms"] - direct
    return Target(
        goal="over streamable HTTP spillbox adds at most what mcp-proxy adds",
        met=ours <= theirs,
        measured=f"{ours / theirs:.2f}x: {ours:.2f} ms added against mcp-proxy's {theirs:.2f} "
        f"(a bare proxy on spillbox's SDK adds {bare:.2f})",
    )


if __name__ == "__main__":
    raise SystemExit(bench_main(run, markdown, targets, sys.argv[1:]))
