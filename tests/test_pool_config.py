"""The warm pool's size: an argument, a SPILLBOX_* setting, a flag; never negative."""

from __future__ import annotations

import pytest

from spillbox.cli import _parser
from spillbox.config import DEFAULT_POOL_SIZE, Settings
from spillbox.errors import ConfigError


def test_the_pool_size_comes_from_the_environment_with_a_default() -> None:
    assert Settings.from_env({}).pool_size == DEFAULT_POOL_SIZE
    assert Settings.from_env({"SPILLBOX_POOL_SIZE": "5"}).pool_size == 5
    assert Settings.from_env({"SPILLBOX_POOL_SIZE": "0"}).pool_size == 0


@pytest.mark.parametrize("raw", ["-1", "two"])
def test_a_pool_size_that_is_no_count_is_refused_in_one_line(raw: str) -> None:
    with pytest.raises(ConfigError, match="SPILLBOX_POOL_SIZE|pool size"):
        Settings.from_env({"SPILLBOX_POOL_SIZE": raw})


def test_the_proxy_takes_a_pool_size() -> None:
    args = _parser().parse_args(["mcp", "proxy", "--listen", "127.0.0.1:0", "--pool-size", "3"])
    assert args.pool_size == 3
