"""LangChain/LangGraph: a graph of one ToolNode given one AIMessage with one small call,
invoked (sync: the tool in ToolNode's thread, SpillboxMiddleware.wrap_tool_call; async:
ainvoke, awrap_tool_call) with and without spillbox's wrappers, the rows judged; and the two
hooks by themselves, around a handler that returns the tool's message, against the handler
alone: what spillbox's own code takes of the rows above."""

from __future__ import annotations

from typing import Any

from frameworks import SMALL, Row, alternate, event_loop, harness, timed

CALLS = 600
QUICK_CALLS = 60
FRAMEWORK = "LangChain/LangGraph"
NOTE = (
    "the ToolNode rows run a graph of one ToolNode, with and without SpillboxMiddleware's "
    "wrappers; the rows alone call the hooks around a handler that returns the tool's "
    "message, against the handler alone."
)


def rows(quick: bool) -> list[Row]:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import StructuredTool
    from langgraph.prebuilt import ToolNode

    from spillbox.integrations.langchain import SpillboxMiddleware

    async def aping() -> str:
        return SMALL

    tool = StructuredTool.from_function(
        func=lambda: SMALL, coroutine=aping, name="ping", description="ping"
    )
    step = {"name": "ping", "args": {}, "id": "c1", "type": "tool_call"}
    state = {"messages": [AIMessage(content="", id="turn-1", tool_calls=[step])]}
    config: Any = {"configurable": {"thread_id": "bench"}}
    calls = QUICK_CALLS if quick else CALLS
    with harness() as made, event_loop() as run:
        spillbox = SpillboxMiddleware(made)
        bare = _graph(ToolNode([tool]))
        gated = _graph(
            ToolNode(
                [tool],
                wrap_tool_call=spillbox.wrap_tool_call,
                awrap_tool_call=spillbox.awrap_tool_call,
            )
        )
        sync = alternate(
            [timed(lambda: bare.invoke(state, config)), timed(lambda: gated.invoke(state, config))],
            calls,
        )
        async_ = alternate(
            [
                timed(lambda: run(bare.ainvoke(state, config))),
                timed(lambda: run(gated.ainvoke(state, config))),
            ],
            calls,
        )
        alone = _hooks_alone(spillbox, run, step, state, config, calls)
        spillbox.end(config)
    return [
        Row(FRAMEWORK, "ToolNode.invoke (wrap_tool_call)", *sync, calls, judged=True),
        Row(FRAMEWORK, "ToolNode.ainvoke (awrap_tool_call)", *async_, calls, judged=True),
        *alone,
    ]


def _hooks_alone(
    spillbox: Any, run: Any, step: Any, state: Any, config: Any, calls: int
) -> list[Row]:
    from langchain_core.messages import ToolMessage
    from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime

    runtime = ToolRuntime(
        state=state,
        context=None,
        config=config,
        stream_writer=lambda _: None,
        tool_call_id="c1",
        store=None,
    )
    request = ToolCallRequest(step, None, state, runtime)
    message = ToolMessage(content=SMALL, tool_call_id="c1", name="ping")

    async def answer(_: Any) -> Any:
        return message

    sync = alternate(
        [
            timed(lambda: message),
            timed(lambda: spillbox.wrap_tool_call(request, lambda _: message)),
        ],
        calls,
    )
    async_ = alternate(
        [
            timed(lambda: run(answer(request))),
            timed(lambda: run(spillbox.awrap_tool_call(request, answer))),
        ],
        calls,
    )
    return [
        Row(FRAMEWORK, "wrap_tool_call alone", *sync, calls),
        Row(FRAMEWORK, "awrap_tool_call alone", *async_, calls),
    ]


def _graph(node: Any) -> Any:
    """A graph of the one ToolNode: how LangGraph runs one (a ToolNode needs a graph's run)."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    graph = StateGraph(MessagesState)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()
