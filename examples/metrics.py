"""A metrics API returns a whole day of 1-minute cpu and latency points for six hosts
(~200k tokens); the model finds the host with the highest p99 latency and the minute of its
peak, unnesting the series in DuckDB.

Run with `python examples/metrics.py [--home DIR]` (needs Docker; builds the sandbox image
if it is missing). It prints the conversation as the model saw it (the notice instead of
the payload, the query, the answer) and the tokens used against sending the result inline.
The scenario itself (data, tool, question, query) is spillbox.demo.metrics.
"""

from __future__ import annotations

from spillbox.demo import metrics, run_example

if __name__ == "__main__":
    raise SystemExit(run_example(metrics))
