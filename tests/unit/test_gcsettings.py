"""The control plane's young-generation GC threshold: applied while it runs, configurable,
and the process's previous setting back once it closes."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from control.app import ControlPlane, ControlPlaneOptions
from control.gcsettings import DEFAULT_YOUNG_THRESHOLD, YoungThreshold


@pytest.fixture(autouse=True)
def _keep_thresholds() -> Iterator[tuple[int, int, int]]:
    """Whatever a test does, the process's thresholds are as they were afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield before
    finally:
        gc.set_threshold(*before)


def test_applied_and_restored() -> None:
    t = YoungThreshold(10_000)
    t.apply()
    assert gc.get_threshold() == (10_000, 10, 10)
    t.apply()  # twice is once
    t.restore()
    assert gc.get_threshold() == (700, 10, 10)
    t.restore()  # and restoring again changes nothing
    assert gc.get_threshold() == (700, 10, 10)


def test_none_leaves_the_interpreter_alone() -> None:
    gc.set_threshold(123, 4, 5)
    t = YoungThreshold(None)
    t.apply()
    assert gc.get_threshold() == (123, 4, 5)
    t.restore()
    assert gc.get_threshold() == (123, 4, 5)


def test_zero_is_refused() -> None:
    # gc.set_threshold(0) would turn the collector off, not make the generation small.
    with pytest.raises(ValueError):
        YoungThreshold(0)


def test_overlapping_owners_share_the_setting() -> None:
    first, second = YoungThreshold(5_000), YoungThreshold(20_000)
    first.apply()
    second.apply()
    assert gc.get_threshold()[0] == 20_000
    first.restore()  # the other one still runs: its setting stays
    assert gc.get_threshold()[0] == 20_000
    second.restore()
    assert gc.get_threshold() == (700, 10, 10)
    # Closed in the other order, the earlier owner's value comes back in between.
    first.apply()
    second.apply()
    second.restore()
    assert gc.get_threshold()[0] == 5_000
    first.restore()
    assert gc.get_threshold() == (700, 10, 10)


def _options(**kw: object) -> ControlPlaneOptions:
    return ControlPlaneOptions(
        xds_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        webhook_address="",
        ui=False,
        **kw,  # type: ignore[arg-type]
    )


async def test_the_control_plane_sets_it_while_running() -> None:
    assert ControlPlaneOptions().gc_young_threshold == DEFAULT_YOUNG_THRESHOLD == 10_000
    cp = ControlPlane(_options())
    await cp.start()
    try:
        assert gc.get_threshold() == (DEFAULT_YOUNG_THRESHOLD, 10, 10)
    finally:
        await cp.close(0)
    assert gc.get_threshold() == (700, 10, 10)


async def test_the_control_plane_takes_its_option() -> None:
    cp = ControlPlane(_options(gc_young_threshold=2_500))
    await cp.start()
    try:
        assert gc.get_threshold()[0] == 2_500
    finally:
        await cp.close(0)
    assert gc.get_threshold() == (700, 10, 10)
    cp = ControlPlane(_options(gc_young_threshold=None))
    await cp.start()
    try:
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        await cp.close(0)
