"""A CRM search returns 200 accounts with nested contacts and ticket histories (~130k
tokens); the model finds the account with the most escalated tickets in 2025 and its owner,
unnesting each account's history in DuckDB.

Run with `python examples/crm_search.py [--home DIR]` (needs Docker; builds the sandbox image
if it is missing). It prints the conversation as the model saw it (the notice instead of
the payload, the query, the answer) and the tokens used against sending the result inline.
The scenario itself (data, tool, question, query) is spillbox.demo.crm_search.
"""

from __future__ import annotations

from spillbox.demo import crm_search, run_example

if __name__ == "__main__":
    raise SystemExit(run_example(crm_search))
