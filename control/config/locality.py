"""Istio `localityLbSetting` -> model LocalityLbSetting, with Istio's validation. Read in two
places: a DestinationRule's `trafficPolicy.loadBalancer` and the mesh config's default.
"""

from __future__ import annotations

from control.config import formats
from control.config.fields import Fields
from control.model.locality import TOPOLOGY_LABELS
from control.model.traffic import LocalityDistribute, LocalityFailover, LocalityLbSetting


def locality_lb_setting(f: Fields) -> LocalityLbSetting:
    enabled = f.raw("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        f.fail("enabled", "must be true or false")
    distribute = tuple(_distribute(item) for item in f.get_maps("distribute"))
    failover = tuple(_failover(item) for item in f.get_maps("failover"))
    priority: list[str] = []
    for path, label in f.get_strs("failoverPriority"):
        key, _, value = label.partition("=")
        problem = formats.label_key(key) or (formats.label_value(value) if value else None)
        if problem:
            f.ctx.fail(path, problem)
        if failover and key in TOPOLOGY_LABELS:
            f.ctx.fail(path, f"cannot be the topology label {key!r} when failover is set")
        priority.append(label)
    if distribute and failover:
        f.fail(None, "set either distribute or failover, not both")
    if distribute and priority:
        f.fail(None, "set either distribute or failoverPriority, not both")
    sources = [d.source for d in distribute]
    if len(set(sources)) != len(sources):
        f.fail("distribute", "repeats a 'from' locality")
    f.finish()
    return LocalityLbSetting(enabled, distribute, failover, tuple(priority))


def _pattern(f: Fields, key: str | int, value: str) -> None:
    """A locality to match: region[/zone[/subzone]], `*` only as the last part."""
    parts = value.split("/")
    wild = value.count("*")
    if len(parts) > 3 or not all(parts) or wild > 1 or (wild and parts[-1] != "*"):
        f.fail(
            key,
            f"locality {value!r} must be region, region/zone or region/zone/subzone, with '*' "
            "only as its last part",
        )


def _distribute(f: Fields) -> LocalityDistribute:
    source = f.get_str("from", required=True)
    _pattern(f, "from", source)
    to: list[tuple[str, int]] = []
    for path, pattern, weight in f.get_items("to"):
        _pattern(f, "to", pattern)
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            f.ctx.fail(path, "locality weight must be an integer 1-100")
        to.append((pattern, weight))
    if not to:
        f.fail("to", "is required (localities and their weights)")
    total = sum(w for _, w in to)
    if total != 100:
        f.fail("to", f"weights must add up to 100 (got {total})")
    f.finish()
    return LocalityDistribute(source, tuple(to))


def _failover(f: Fields) -> LocalityFailover:
    source = f.get_str("from", required=True)
    to = f.get_str("to", required=True)
    for key, region in (("from", source), ("to", to)):
        if "/" in region or "*" in region:
            f.fail(key, f"must be a region, without '/' or '*' (got {region!r})")
    if source == to:
        f.fail(None, "from and to must be different regions")
    f.finish()
    return LocalityFailover(source, to)
