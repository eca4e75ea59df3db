"""A repository API returns 400 pull requests with long bodies (~100k tokens); the model
finds which author has the most merged pull requests labelled 'bug' with one DuckDB query.

Run with `python examples/pull_requests.py [--home DIR]` (needs Docker; builds the sandbox image
if it is missing). It prints the conversation as the model saw it (the notice instead of
the payload, the query, the answer) and the tokens used against sending the result inline.
The scenario itself (data, tool, question, query) is spillbox.demo.pull_requests.
"""

from __future__ import annotations

from spillbox.demo import pull_requests, run_example

if __name__ == "__main__":
    raise SystemExit(run_example(pull_requests))
