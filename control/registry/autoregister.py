"""Workloads registered by connected proxies (Istio WorkloadGroup-style auto-registration).

A proxy's first stream registers its workload; the workload stays while any stream of that
proxy is open and is removed `grace` seconds after the last one closes, so a proxy that
reconnects (control-plane restart, network blip) never flaps out of its services' endpoints.

The bookkeeping is sans-IO (`now` in, changes out); `expire()` is called by a timer in the
server adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control.model.proxy import Proxy
from control.model.types import SourceRef, Workload


@dataclass(slots=True)
class _Entry:
    workload: Workload
    streams: int
    closed_at: float | None = None


class WorkloadRegistry:
    def __init__(self, grace: float = 10.0) -> None:
        self.grace = grace
        self._by_key: dict[tuple[str, str], _Entry] = {}
        self.version = 0  # bumped on every change of the workload set

    @staticmethod
    def _key(proxy: Proxy) -> tuple[str, str]:
        return (proxy.ip, proxy.id)

    def connect(self, proxy: Proxy) -> bool:
        """A stream of `proxy` opened. Returns True when the workload set changed."""
        if not proxy.auto_register:
            return False
        key = self._key(proxy)
        wl = proxy.as_workload()
        entry = self._by_key.get(key)
        if entry is None:
            self._by_key[key] = _Entry(wl, 1)
            self.version += 1
            return True
        entry.streams += 1
        entry.closed_at = None
        if entry.workload != wl:
            entry.workload = wl
            self.version += 1
            return True
        return False

    def disconnect(self, proxy: Proxy, now: float) -> None:
        entry = self._by_key.get(self._key(proxy))
        if entry is None:
            return
        entry.streams = max(0, entry.streams - 1)
        if entry.streams == 0:
            entry.closed_at = now

    def next_expiry(self) -> float | None:
        times = [e.closed_at + self.grace for e in self._by_key.values() if e.closed_at is not None]
        return min(times) if times else None

    def expire(self, now: float) -> list[Workload]:
        """Drop workloads whose last stream closed at least `grace` ago; returns them."""
        gone = [
            k
            for k, e in self._by_key.items()
            if e.closed_at is not None and now - e.closed_at >= self.grace
        ]
        removed = [self._by_key.pop(k).workload for k in gone]
        if removed:
            self.version += 1
        return removed

    def snapshot(self) -> list[dict[str, Any]]:
        """The registered workloads as JSON-able entries, so a restarted control plane keeps
        serving their endpoints while their proxies reconnect (no gap in EDS)."""
        return [
            {
                "proxy": key[1],
                "name": e.workload.name,
                "namespace": e.workload.namespace,
                "address": e.workload.address,
                "labels": dict(e.workload.labels),
                "service_account": e.workload.service_account,
                "has_sidecar": e.workload.has_sidecar,
                "proxyless": e.workload.proxyless,
            }
            for key, e in sorted(self._by_key.items())
        ]

    def restore(self, entries: list[dict[str, Any]], now: float) -> int:
        """Load a snapshot: each workload counts as disconnected at `now`, so it is dropped
        after the grace period unless its proxy comes back. Bad entries are skipped."""
        restored = 0
        for item in entries:
            try:
                wl = Workload(
                    name=str(item["name"]),
                    namespace=str(item["namespace"]),
                    address=str(item["address"]),
                    labels=tuple(sorted((str(k), str(v)) for k, v in item["labels"].items())),
                    service_account=str(item["service_account"]),
                    source=SourceRef("Proxy", str(item["namespace"]), str(item["name"])),
                    has_sidecar=bool(item.get("has_sidecar", True)),
                    proxyless=bool(item.get("proxyless", False)),
                )
                key = (wl.address, str(item["proxy"]))
            except (KeyError, TypeError, AttributeError, ValueError):
                continue
            if key not in self._by_key:
                self._by_key[key] = _Entry(wl, 0, closed_at=now)
                restored += 1
        if restored:
            self.version += 1
        return restored

    def workloads(self) -> tuple[Workload, ...]:
        return tuple(e.workload for _, e in sorted(self._by_key.items()))
