"""The step core: the results of one model turn reach the admit function as one step, whether
a framework names the step (submit, submit_sync) or the MCP proxy infers it from overlap (run;
tests/mcp/test_proxy_toy.py drives that through a real proxy). The gate itself is Task.admit,
tested elsewhere; here the admit function records the steps it is given."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import partial

import anyio
import pytest

from spillbox.steps import ADMIT_IN_LOOP_CHARS, Steps
from spillbox.types import Admitted, ToolResult

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Recorder:
    """An admit function that records each step's call ids (and the thread it ran on)."""

    def __init__(self, fail: bool = False) -> None:
        self.steps: list[list[str]] = []
        self.threads: list[str] = []
        self.fail = fail

    def __call__(self, results: Sequence[ToolResult]) -> list[Admitted]:
        self.steps.append([result.call_id for result in results])
        self.threads.append(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("the task's storage is full")
        return [_admitted(result) for result in results]


def _admitted(result: ToolResult) -> Admitted:
    return Admitted(
        call_id=result.call_id,
        tool=result.tool,
        text=f"seen {result.call_id}",
        offloaded=False,
        reason=None,
        tokens=1,
        tokens_exact=True,
        inline_tokens=1,
        artifact=None,
    )


def _result(call_id: str, size: int = 10) -> ToolResult:
    return ToolResult(call_id=call_id, tool="t", content="x" * size)


async def test_a_named_step_is_admitted_once_all_its_results_are_in() -> None:
    admit = Recorder()
    steps = Steps(admit, bound=30)
    answers: dict[str, str] = {}

    async def one(call_id: str, delay: float) -> None:
        await anyio.sleep(delay)
        admitted = await steps.submit(_result(call_id), step="turn-1", expected=3)
        answers[call_id] = admitted.text

    with anyio.fail_after(10):  # far below the bound: the third result closes the step
        async with anyio.create_task_group() as group:
            for call_id, delay in (("a", 0), ("b", 0.05), ("c", 0.1)):
                group.start_soon(one, call_id, delay)
    assert admit.steps == [["a", "b", "c"]]
    assert answers == {"a": "seen a", "b": "seen b", "c": "seen c"}


async def test_two_keys_are_two_steps_and_a_late_result_starts_a_new_one() -> None:
    admit = Recorder()
    steps = Steps(admit, bound=30)
    async with anyio.create_task_group() as group:
        group.start_soon(partial(steps.submit, _result("a1"), step="A", expected=2))
        group.start_soon(partial(steps.submit, _result("b1"), step="B", expected=1))
        group.start_soon(partial(steps.submit, _result("a2"), step="A", expected=2))
    await steps.submit(_result("a3"), step="A", expected=1)
    assert sorted(admit.steps) == [["a1", "a2"], ["a3"], ["b1"]]


async def test_a_step_whose_other_results_never_come_is_admitted_at_the_bound() -> None:
    admit = Recorder()
    steps = Steps(admit, bound=0.2)
    admitted = await steps.submit(_result("only"), step="turn", expected=3)
    assert admitted.text == "seen only"
    assert admit.steps == [["only"]]


async def test_every_result_of_a_step_hears_its_admit_error() -> None:
    steps = Steps(Recorder(fail=True), bound=30)
    errors: list[str] = []

    async def one(call_id: str) -> None:
        with pytest.raises(RuntimeError) as caught:
            await steps.submit(_result(call_id), step="turn", expected=2)
        errors.append(str(caught.value))

    async with anyio.create_task_group() as group:
        group.start_soon(one, "a")
        group.start_soon(one, "b")
    assert errors == ["the task's storage is full"] * 2


async def test_a_cancelled_result_leaves_its_step() -> None:
    admit = Recorder()
    steps = Steps(admit, bound=30)
    async with anyio.create_task_group() as group:
        with anyio.move_on_after(0.1):
            await steps.submit(_result("gone"), step="turn", expected=2)
        group.start_soon(partial(steps.submit, _result("kept"), step="turn", expected=2))
        await anyio.sleep(0.1)
        group.start_soon(partial(steps.submit, _result("third"), step="turn", expected=2))
    assert admit.steps == [["kept", "third"]]


async def test_a_large_step_is_admitted_in_a_worker_thread_a_small_one_on_the_loop() -> None:
    admit = Recorder()
    steps = Steps(admit)
    await steps.submit(_result("small"), step=1, expected=1)
    await steps.submit(_result("large", ADMIT_IN_LOOP_CHARS + 1), step=2, expected=1)
    assert admit.threads[0] == threading.current_thread().name
    assert admit.threads[1] != threading.current_thread().name


def test_the_sync_twin_holds_each_thread_until_its_step_is_admitted() -> None:
    admit = Recorder()
    steps = Steps(admit, bound=30)
    answers: dict[str, str] = {}

    def one(call_id: str) -> None:
        answers[call_id] = steps.submit_sync(_result(call_id), step="turn", expected=3).text

    threads = [threading.Thread(target=one, args=(c,)) for c in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert len(admit.steps) == 1 and sorted(admit.steps[0]) == ["a", "b", "c"]
    assert answers == {"a": "seen a", "b": "seen b", "c": "seen c"}


def test_the_sync_twin_admits_at_the_bound_and_reports_errors() -> None:
    steps = Steps(Recorder(fail=True), bound=0.2)
    with pytest.raises(RuntimeError, match="storage is full"):
        steps.submit_sync(_result("only"), step="turn", expected=2)


@pytest.mark.parametrize("expected", [0, -1])
async def test_a_step_expects_at_least_one_result(expected: int) -> None:
    steps = Steps(Recorder())
    with pytest.raises(ValueError, match="at least one result"):
        await steps.submit(_result("a"), step="turn", expected=expected)
    with pytest.raises(ValueError, match="at least one result"):
        steps.submit_sync(_result("a"), step="turn", expected=expected)
