"""Steps.withdraw: a call of a named step that raises (a framework's retry, a deferral) says
so, and the step's other results are admitted without waiting for it until the bound."""

from __future__ import annotations

import anyio
import pytest

from spillbox.steps import Steps
from test_steps import Recorder, _result

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_withdrawn_call_is_not_waited_for() -> None:
    admit = Recorder()
    steps = Steps(admit, bound=3600)
    answers: dict[str, str] = {}

    async def one(call_id: str) -> None:
        answers[call_id] = (await steps.submit(_result(call_id), step="t", expected=3)).text

    async def failing() -> None:
        await anyio.sleep(0.05)
        steps.withdraw(step="t", expected=3)

    with anyio.fail_after(30):  # far below the bound: the withdrawal completes the step
        async with anyio.create_task_group() as group:
            group.start_soon(one, "a")
            group.start_soon(failing)
            group.start_soon(one, "b")
    assert admit.steps == [["a", "b"]]
    assert answers == {"a": "seen a", "b": "seen b"}


async def test_a_call_withdrawn_before_the_others_arrive_still_counts() -> None:
    admit = Recorder()
    steps = Steps(admit, bound=3600)
    steps.withdraw(step="t", expected=2)
    with anyio.fail_after(30):
        admitted = await steps.submit(_result("a"), step="t", expected=2)
    assert admitted.text == "seen a"
    assert admit.steps == [["a"]]


async def test_a_step_all_of_whose_calls_withdrew_leaves_nothing_open() -> None:
    admit = Recorder()
    steps = Steps(admit, bound=3600)
    steps.withdraw(step="t", expected=2)
    steps.withdraw(step="t", expected=2)
    with anyio.fail_after(30):  # a new step under the key, not one stuck at zero expected
        await steps.submit(_result("c"), step="t", expected=1)
    assert admit.steps == [["c"]]
