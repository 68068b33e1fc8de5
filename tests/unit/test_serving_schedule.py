"""When the control plane re-issues its own TLS certificate (control/ca/serving.py)."""

from __future__ import annotations

import datetime as dt

from control.ca.serving import MIN_RENEWAL_DELAY, ServingCert, renewal_time

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def cert(lifetime: dt.timedelta) -> ServingCert:
    return ServingCert(("leaf", "root"), b"key", 1, T0, T0 + lifetime)


def test_renewal_is_half_way_through_the_lifetime() -> None:
    assert renewal_time(cert(dt.timedelta(days=365)), T0) == T0 + dt.timedelta(days=182.5)
    assert renewal_time(cert(dt.timedelta(seconds=20)), T0) == T0 + dt.timedelta(seconds=10)


def test_a_vanishing_lifetime_does_not_spin() -> None:
    """A leaf capped by a CA about to expire (or already past half-way) waits the minimum."""
    now = T0 + dt.timedelta(seconds=30)
    assert renewal_time(cert(dt.timedelta(seconds=2)), now) == now + MIN_RENEWAL_DELAY


def test_presented_chain_leaves_out_the_root() -> None:
    assert cert(dt.timedelta(days=1)).presented_chain == b"leaf"
    assert ServingCert(("root-signed-leaf",), b"k", 1, T0, T0).presented_chain == (
        b"root-signed-leaf"
    )
