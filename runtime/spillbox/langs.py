"""The code-mode languages, in a module of their own: the command line builds its parser
from them, and `spillbox --version` should not pay for the records in spillbox.types."""

from __future__ import annotations

from typing import Literal, get_args

Lang = Literal["sql", "jq", "python", "sh"]
"""The code-mode languages."""
LANGS: tuple[str, ...] = get_args(Lang)
