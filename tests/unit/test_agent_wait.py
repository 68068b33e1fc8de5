"""`pilotfish-agent wait`'s poll schedule and flags, without sockets."""

from __future__ import annotations

import pytest

from agent.wait import (
    Finish,
    Outcome,
    Poll,
    WaitError,
    WaitSchedule,
    WaitSettings,
    build_parser,
    describe,
    settings_from_args,
)

URL = "http://10.0.0.5:15020/healthz/ready"
NOT_READY = Outcome(503, "503 no LDS yet")


def test_first_poll_is_immediate() -> None:
    s = WaitSchedule(WaitSettings(URL, timeout=60, period=0.2, request_timeout=0.5), 100.0)
    assert s.first() == Poll(100.0, 0.5)


def test_200_finishes_with_0() -> None:
    s = WaitSchedule(WaitSettings(URL), 0.0)
    assert s.after(Outcome(200, "200 ready"), 0.0, 0.01) == Finish(0, f"ready: {URL}")


def test_polls_start_a_period_apart() -> None:
    s = WaitSchedule(WaitSettings(URL, period=0.2), 0.0)
    # A quick 503: the next poll waits out the rest of the period.
    assert s.after(NOT_READY, 1.0, 1.01) == Poll(1.2, 0.5)
    # A slow answer (or a request timeout) used the period up: poll again at once.
    assert s.after(NOT_READY, 1.0, 1.5) == Poll(1.5, 0.5)


def test_no_request_outlives_the_deadline() -> None:
    s = WaitSchedule(WaitSettings(URL, timeout=2, period=0.2, request_timeout=0.5), 0.0)
    step = s.after(NOT_READY, 1.7, 1.75)
    assert isinstance(step, Poll)
    assert (step.at, step.request_timeout) == (1.9, pytest.approx(0.1))
    # The last poll at the deadline still gets a short chance to answer.
    assert s.after(NOT_READY, 1.9, 1.95) == Poll(2.0, 0.05)


def test_timeout_reports_the_last_outcome() -> None:
    s = WaitSchedule(WaitSettings(URL, timeout=2), 0.0)
    assert s.after(Outcome(None, "Connection refused"), 1.99, 2.0) == Finish(
        1, f"not ready after 2s: {URL}: Connection refused"
    )
    assert s.after(NOT_READY, 2.0, 2.01) == Finish(1, f"not ready after 2s: {URL}: 503 no LDS yet")


def test_ready_at_the_deadline_still_counts() -> None:
    s = WaitSchedule(WaitSettings(URL, timeout=2), 0.0)
    assert s.after(Outcome(200, "200 ready"), 2.0, 2.05).code == 0  # type: ignore[union-attr]


def test_describe_is_one_line() -> None:
    assert describe(503, b"not ready:\n  no LDS yet\n") == "503 not ready: no LDS yet"
    assert len(describe(503, b"x" * 5000)) < 210
    assert describe(None, error=ConnectionRefusedError(111, "Connect call failed")) == (
        "Connection refused"
    )
    assert describe(None, error=TimeoutError()) == "no answer within the request timeout"


def test_defaults_as_the_agent() -> None:
    s = settings_from_args(build_parser().parse_args([]))
    assert s == WaitSettings("http://127.0.0.1:15020/healthz/ready", 60.0, 0.2, 0.5)


def test_instance_ip_is_the_default_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INSTANCE_IP", "fd00::7")
    s = settings_from_args(build_parser().parse_args(["--status-port", "16020"]))
    assert s.url == "http://[fd00::7]:16020/healthz/ready"


def test_istio_flag_names() -> None:
    args = ["--timeoutSeconds", "30", "--periodMillis", "500", "--requestTimeoutMillis", "250"]
    s = settings_from_args(build_parser().parse_args(args))
    assert (s.timeout, s.period, s.request_timeout) == (30.0, 0.5, 0.25)
    # Our own names win when both are given.
    s = settings_from_args(build_parser().parse_args([*args, "--timeout", "5"]))
    assert s.timeout == 5.0


@pytest.mark.parametrize(
    "argv",
    [
        ["--timeout", "0"],
        ["--period", "-1"],
        ["--url", "https://x/healthz/ready"],
        ["--status-port", "0"],
    ],
)
def test_bad_flags(argv: list[str]) -> None:
    with pytest.raises(WaitError):
        settings_from_args(build_parser().parse_args(argv))
