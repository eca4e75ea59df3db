"""The main job, for now: offload a sample tool result, show the notice, query it in code mode.

Run with `make demo` (sets up Docker and the sandbox image first) or
`python examples/sample_offload.py [--home DIR]`.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile

from spillbox import Harness, ToolResult


def pull_requests(n: int = 400, seed: int = 7) -> str:
    """A repository API's answer: hundreds of pull requests with long bodies."""
    rng = random.Random(seed)
    words = "fix parser cache retry timeout flaky test refactor docs api schema migrate".split()
    prs = [
        {
            "number": 1000 + i,
            "title": " ".join(rng.choices(words, k=5)),
            "state": rng.choice(["open", "closed", "merged"]),
            "author": rng.choice(["ana", "bo", "chen", "dee"]),
            "body": " ".join(rng.choices(words, k=120)),
        }
        for i in range(n)
    ]
    return json.dumps(prs, indent=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--home", help="spillbox home (default: a temp folder)")
    args = parser.parse_args()
    home = args.home or tempfile.mkdtemp(prefix="spillbox-demo-")
    payload = pull_requests()
    harness = Harness(sandbox="docker", home=home)
    with harness.task("demo") as task:
        [item] = task.admit([ToolResult(call_id="c1", tool="list_pull_requests", content=payload)])
        print(f"tool result: {len(payload):,} bytes, {item.tokens:,} tokens")
        print(f"in context instead: {item.inline_tokens} tokens\n")
        print(item.text, "\n")
        question = (
            'SELECT author, count(*) AS merged FROM "c1" '
            "WHERE state = 'merged' GROUP BY author ORDER BY merged DESC, author"
        )
        print(f"sql> {question}")
        result = task.exec("sql", question)
        print(result.text)
        expected = {}
        for pr in json.loads(payload):
            if pr["state"] == "merged":
                expected[pr["author"]] = expected.get(pr["author"], 0) + 1
        got = {row.split(",")[0]: int(row.split(",")[1]) for row in result.text.splitlines()[1:]}
        task.close(delete=True)
    if got != expected or result.exit_code != 0:
        print(f"wrong answer: expected {expected}, got {got}; stderr: {result.stderr}")
        return 1
    print("answer checked against the payload: correct")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
