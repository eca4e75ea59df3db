"""Configuration: a frozen Policy, and the environment read in one place."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from spillbox.config import (
    DEFAULT_AGGREGATE_TOKENS,
    DEFAULT_PER_CALL_TOKENS,
    Policy,
    Settings,
)
from spillbox.errors import ConfigError, SpillboxError


def test_policy_defaults_match_the_design() -> None:
    policy = Policy()
    assert policy.per_call_tokens == DEFAULT_PER_CALL_TOKENS == 6_000
    assert policy.aggregate_tokens == DEFAULT_AGGREGATE_TOKENS == 10_000
    assert policy.notice_max_tokens == 400
    assert policy.preview_chars == 100
    assert policy.encoding == "cl100k_base"


def test_policy_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Policy().per_call_tokens = 1  # type: ignore[misc]


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "6000", None])
@pytest.mark.parametrize("field", ["per_call_tokens", "aggregate_tokens", "notice_max_tokens"])
def test_policy_rejects_non_positive_whole_numbers(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        Policy(**{field: value})  # type: ignore[arg-type]


def test_from_env_with_nothing_set_gives_defaults() -> None:
    settings = Settings.from_env(environ={})
    assert settings.policy == Policy()
    assert settings.sandbox == "docker"
    assert settings.home.is_absolute()


def test_from_env_reads_the_thresholds() -> None:
    settings = Settings.from_env(
        environ={"SPILLBOX_PER_CALL_TOKENS": "2000", "SPILLBOX_AGGREGATE_TOKENS": " 3500 "}
    )
    assert settings.policy.per_call_tokens == 2_000
    assert settings.policy.aggregate_tokens == 3_500


def test_from_env_reads_home_sandbox_and_encoding(tmp_path: Path) -> None:
    settings = Settings.from_env(
        environ={
            "SPILLBOX_HOME": str(tmp_path / "h"),
            "SPILLBOX_SANDBOX": "none",
            "SPILLBOX_ENCODING": "o200k_base",
        }
    )
    assert settings.home == tmp_path / "h"
    assert settings.sandbox == "none"
    assert settings.policy.encoding == "o200k_base"


def test_from_env_expands_user_in_home() -> None:
    settings = Settings.from_env(environ={"SPILLBOX_HOME": "~/spillbox-home"})
    assert "~" not in str(settings.home)
    assert settings.home.name == "spillbox-home"


def test_empty_values_mean_default() -> None:
    settings = Settings.from_env(
        environ={"SPILLBOX_PER_CALL_TOKENS": "", "SPILLBOX_AGGREGATE_TOKENS": ""}
    )
    assert settings.policy == Policy()


@pytest.mark.parametrize("raw", ["abc", "1.5", "6k", "1e4", "0", "-10"])
@pytest.mark.parametrize("name", ["SPILLBOX_PER_CALL_TOKENS", "SPILLBOX_AGGREGATE_TOKENS"])
def test_bad_threshold_values_are_config_errors(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(environ={name: raw})
    assert isinstance(info.value, SpillboxError)
    # The message names what was wrong, so a user can find the setting.
    field = "per_call_tokens" if "PER_CALL" in name else "aggregate_tokens"
    assert name in str(info.value) or field in str(info.value)


def test_unknown_sandbox_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown sandbox"):
        Settings.from_env(environ={"SPILLBOX_SANDBOX": "vm"})


def test_from_env_without_argument_reads_the_process_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPILLBOX_PER_CALL_TOKENS", "1234")
    monkeypatch.setenv("SPILLBOX_HOME", str(tmp_path))
    monkeypatch.delenv("SPILLBOX_AGGREGATE_TOKENS", raising=False)
    settings = Settings.from_env()
    assert settings.policy.per_call_tokens == 1_234
    assert settings.policy.aggregate_tokens == DEFAULT_AGGREGATE_TOKENS
    assert settings.home == tmp_path


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings.from_env(environ={}).sandbox = "none"  # type: ignore[misc]
