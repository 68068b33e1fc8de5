"""EDS is generated once per visibility class and push, not once per stream (issue 23,
target 5): counted in outbound-plan lookups, never timed. The push_fanout benchmark times it.
"""

from __future__ import annotations

import pytest

from control.generate import endpoints, generators_for
from control.generate.context import GenContext
from control.generate.plans import OutboundPlan
from control.metrics import Metrics
from control.model.proxy import Proxy, proxy_from_node
from control.pipeline import CurrentPush
from control.xds.cache import ResourceCache
from protos import typeurls
from tests.unit.test_incremental_push import TYPES, rules

EDS = typeurls.ENDPOINT


def _proxy(i: int, ns: str = "default", metadata: dict[str, object] | None = None) -> Proxy:
    return proxy_from_node(
        f"sidecar~10.9.{i // 250}.{i % 250}~c-{i}.{ns}~{ns}.svc.cluster.local", metadata or {}
    )


def _current() -> CurrentPush:
    current = CurrentPush(
        ResourceCache(),
        Metrics(),
        trust_domain="cluster.local",
        outbound_traffic_policy="ALLOW_ANY",
    )
    current.advance(rules(), (), started=1.0)
    return current


def _counting_plans(monkeypatch: pytest.MonkeyPatch) -> list[Proxy]:
    asked: list[Proxy] = []
    real = endpoints.outbound_plan

    def counted(ctx: GenContext, proxy: Proxy) -> OutboundPlan:
        asked.append(proxy)
        return real(ctx, proxy)

    monkeypatch.setattr(endpoints, "outbound_plan", counted)
    return asked


def test_eds_is_generated_once_per_visibility_class_and_push(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = _counting_plans(monkeypatch)
    current = _current()
    # Three classes: plain sidecars in default (with and without SDS: EDS does not look at
    # it), sidecars in shop (its Sidecar scopes what they see), labelled ones in default.
    default = [_proxy(i, metadata={"SDS": "true"} if i % 2 else {}) for i in range(100)]
    shop = [_proxy(100 + i, "shop") for i in range(100)]
    labelled = [_proxy(200 + i, metadata={"LABELS": {"app": "reviews"}}) for i in range(100)]
    got = {p.id: current.resources(p, (EDS,))[EDS] for p in default + shop + labelled}
    assert len(asked) == 3
    assert {got[p.id].digest for p in shop} != {got[p.id].digest for p in default}
    # The next push: its own sets (none is kept from the push before), once per class again.
    current.advance(rules(), (), started=2.0)
    for p in default + shop + labelled:
        current.resources(p, (EDS,))
    assert len(asked) == 6


def test_the_shared_sets_are_what_each_proxy_would_be_generated() -> None:
    current = _current()
    routers = [
        proxy_from_node(f"router~10.8.0.{i}~gw-{i}.default~default.svc.cluster.local", {})
        for i in range(3)
    ]
    ps = [
        _proxy(1),
        _proxy(2, metadata={"SDS": "true"}),
        _proxy(3, "shop"),
        _proxy(4, metadata={"INTERCEPTION_MODE": "REDIRECT", "LABELS": {"app": "reviews"}}),
        _proxy(5, metadata={"GENERATOR": "grpc"}),
        *routers,
    ]
    for _ in range(2):  # the first ask of a class fills its slot, the second reads it
        for p in ps:
            got = current.resources(p, TYPES)
            fresh = GenContext(current.index, ResourceCache())
            want = {t: generators_for(p)[t](fresh, p) for t in TYPES}
            assert {t: s.digest for t, s in got.items()} == {t: s.digest for t, s in want.items()}
