"""The agent's upstream keepalive settings: flags, environment, validation."""

from __future__ import annotations

import pytest

from agent.config import AgentConfigError, build_parser, config_from_args


def test_keepalive_defaults_match_istio_like_values() -> None:
    cfg = config_from_args(build_parser().parse_args([]), {})
    assert (cfg.keepalive_time, cfg.keepalive_timeout) == (30.0, 10.0)


def test_keepalive_flags() -> None:
    args = build_parser().parse_args(["--keepalive-time", "12", "--keepalive-timeout", "1.5"])
    cfg = config_from_args(args, {})
    assert (cfg.keepalive_time, cfg.keepalive_timeout) == (12.0, 1.5)


def test_keepalive_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PILOTFISH_KEEPALIVE_TIME", "15")
    monkeypatch.setenv("PILOTFISH_KEEPALIVE_TIMEOUT", "3")
    cfg = config_from_args(build_parser().parse_args([]), {})
    assert (cfg.keepalive_time, cfg.keepalive_timeout) == (15.0, 3.0)


@pytest.mark.parametrize("flag", ["--keepalive-time", "--keepalive-timeout"])
def test_keepalive_must_be_positive(flag: str) -> None:
    with pytest.raises(AgentConfigError, match="must be positive"):
        config_from_args(build_parser().parse_args([flag, "0"]), {})
