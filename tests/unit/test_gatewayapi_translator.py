"""The Gateway API translation done per changed route (control/gatewayapi/translate.py): a
Translator that has seen the previous config answers exactly what a translation from nothing
answers (sources included), over random sequences of changes to routes (rules, hostnames,
parentRefs, kinds, moves within a file), Gateways (listeners, a second Gateway), the
GatewayClass, ReferenceGrants, Services, Secrets and namespace labels; a change to routes
alone translates those routes alone and keeps every other VirtualService object."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from control.config.loader import load_text
from control.config.merge import merge
from control.config.objects import FileConfig
from control.gatewayapi import translate as translate_module
from control.gatewayapi.translate import Translator
from control.model.gatewayapi import GROUP, ApiRoute
from control.model.types import Labels, MeshConfig
from tests.support.gatewayapi import (
    Obj,
    backend,
    dump,
    gateway,
    gateway_class,
    listener,
    reference_grant,
    route,
    service,
)

NAMESPACES = ("infra", "apps", "infra-apps")
HOSTS = (
    "shared.example.com",
    "*.x.example.com",
    "wildcard.x.example.com",  # the VirtualService name of `*.x.example.com` too
    "a.x.example.com",
    "other.test",
)
PARENTS: tuple[Obj, ...] = (
    {"name": "gw", "namespace": "infra"},
    {"name": "gw", "namespace": "infra", "sectionName": "http"},
    {"name": "gw", "namespace": "infra", "port": 9090},
    {"name": "gw", "namespace": "infra", "sectionName": "tls"},
    {"name": "gw2", "namespace": "infra"},
    {"name": "missing", "namespace": "infra"},
)
CERT = {"mode": "Terminate", "certificateRefs": [{"name": "cert"}]}


def _listeners(rng: random.Random) -> list[Obj]:
    pool = [
        listener("http", 8080, from_="All"),
        listener(
            "wild", 9090, hostname=rng.choice(("*.example.com", "*.x.example.com")), from_="All"
        ),
        listener("sel", 7070, from_="Selector", selector={"matchLabels": {"team": "a"}}),
        listener("same", 7070, hostname="shared.example.com"),
        listener("https", 8443, "HTTPS", from_="All", tls=CERT),
        listener("tls", 9443, "TLS", from_="All", tls={"mode": "Passthrough"}),
        listener("tcp", 9000, "TCP", from_="All"),
    ]
    return [ls for ls in pool if rng.random() < 0.7] or pool[:1]


def _rules(rng: random.Random, kind: str) -> list[Obj]:
    def refs() -> list[Obj]:
        out = [backend(rng.choice(("v1", "v2", "v3")), weight=rng.choice((90, 50, 0)))]
        if rng.random() < 0.4:
            out.append(backend("v2", namespace=rng.choice(("", "infra", "apps"))))
        return out

    if kind in ("TLSRoute", "TCPRoute"):
        return [{"backendRefs": refs()}]
    rules: list[Obj] = []
    for _ in range(rng.randint(0, 2)):
        if kind == "GRPCRoute":
            match: Obj = {"method": {"service": f"s{rng.randrange(3)}.Svc"}}
        else:
            match = {
                "path": {
                    "type": rng.choice(("PathPrefix", "Exact")),
                    "value": f"/p{rng.randrange(4)}",
                }
            }
            if rng.random() < 0.3:
                match["headers"] = [{"name": "x-user", "value": f"u{rng.randrange(3)}"}]
        rule: Obj = {"matches": [match], "backendRefs": refs()}
        if rng.random() < 0.2:  # two mirrors: a warning naming the route
            mirror = {"type": "RequestMirror", "requestMirror": {"backendRef": backend("v1")}}
            rule["filters"] = [mirror, mirror]
        rules.append(rule)
    return rules


def _route(n: int, rng: random.Random) -> Obj:
    """Route `n` of a random kind. Names are unique per file, yet collide across kinds and
    namespaces on purpose: a GRPCRoute takes the name of an HTTPRoute of its namespace (the
    same place in precedence), and TLS/TCP routes of `infra`/`apps-tK` and `infra-apps`/`tK`
    spell the same VirtualService name."""
    kind = rng.choices(("HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute"), (6, 2, 1, 1))[0]
    namespace = NAMESPACES[n % 3]
    if kind == "HTTPRoute":
        name = f"r{n}"
    elif kind == "GRPCRoute":
        name = f"r{n + 3 if (n // 3) % 2 == 0 else n - 3}"
    else:
        name = f"apps-t{n // 3}" if namespace == "infra" else f"t{n // 3}"
    version = f"{GROUP}/v1alpha2" if kind in ("TLSRoute", "TCPRoute") else f"{GROUP}/v1"
    return route(
        name,
        namespace,
        kind=kind,
        api_version=version,
        parents=rng.sample(PARENTS, rng.randint(1, 2)),
        hostnames=rng.sample(HOSTS, rng.randint(0, 2)) + [f"h{n}.example.com"] * rng.randint(0, 1),
        rules=_rules(rng, kind),
    )


class World:
    """Config files parsed once each (as the watcher keeps an unchanged file's objects), the
    namespace labels and Secrets around them, and one Translator that sees every config."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.texts: dict[str, str] = {}
        self.parsed: dict[str, FileConfig] = {}
        self.labels: dict[str, Labels] = {}
        self.secrets: set[tuple[str, str]] = {("infra", "cert")}
        self.translator = Translator()
        self.put("base.yaml", service("v2"), service("v2", "apps"))
        self.put("services.yaml", service("v1"))
        self.put("class.yaml", gateway_class())
        self.put("gw.yaml", gateway(listeners=_listeners(rng)))
        for n in range(12):
            self.put(f"r{n}.yaml", _route(n, rng))

    def put(self, name: str, *objects: Obj, prefix: str = "") -> None:
        self.texts[name] = prefix + dump(*objects)
        self.parsed[name] = load_text(self.texts[name], name)

    def drop(self, name: str) -> None:
        self.texts.pop(name, None)
        self.parsed.pop(name, None)

    def merge(self, translator: Translator | None) -> MeshConfig:
        labels: Callable[[str], Labels] = lambda ns: self.labels.get(ns, ())  # noqa: E731
        return merge(
            list(self.parsed.values()),
            namespace_labels=labels,
            secrets=set(self.secrets),
            translator=translator,
        )

    def change(self) -> tuple[str, bool]:
        """One random change: what it was, and whether it touched routes alone."""
        rng = self.rng
        routes = sorted(n for n in self.texts if n.startswith("r"))
        what = rng.randrange(16)
        if what < 4 and routes:
            name = rng.choice(routes)
            self.put(name, _route(int(name[1:-5]), rng))
            return f"edit {name}", True
        if what == 4 and routes:
            name = rng.choice(routes)
            self.put(name, yaml_of(self.texts[name]), prefix="# moved\n" * rng.randint(1, 3))
            return f"move {name} in its file", True
        if what == 5 and routes:
            name = rng.choice(routes)
            self.drop(name)
            return f"drop {name}", True
        if what == 6:
            n = rng.randrange(18)
            self.put(f"r{n}.yaml", _route(n, rng))
            return f"put r{n}.yaml", True
        if what == 7:
            grants = [
                reference_grant("apps-in", "infra", "apps"),
                reference_grant(
                    "wide-in",
                    "infra",
                    "infra-apps",
                    from_kind=rng.choice(("HTTPRoute", "TLSRoute")),
                ),
                reference_grant("to-apps", "apps", "infra", to_name=rng.choice(("", "v2", "v9"))),
            ]
            chosen = [g for g in grants if rng.random() < 0.5]
            if chosen:
                self.put("grant.yaml", *chosen)
            else:
                self.drop("grant.yaml")
            return "grants", False
        if what == 8:
            self.put("gw.yaml", gateway(listeners=_listeners(rng)))
            return "listeners", False
        if what == 9:
            if "gw2.yaml" in self.texts:
                self.drop("gw2.yaml")
            else:
                self.put("gw2.yaml", gateway("gw2", listeners=_listeners(rng)))
            return "second gateway", False
        if what == 10:
            extra = [service("v3")] if rng.random() < 0.5 else []
            v1 = service("v1", port=rng.choice((8080, 8081)))
            # A selector the translation does not read: Services unequal, their facts equal.
            v1["spec"]["selector"] = {"app": rng.choice(("v1", "v1-b"))}
            self.put("services.yaml", v1, *extra)
            return "services", False
        if what == 11:
            self.labels["apps"] = (("team", "a"),) if not self.labels.get("apps") else ()
            return "namespace labels", False
        if what == 12:
            self.secrets ^= {("infra", "cert")}
            return "secrets", False
        if what == 13:
            self.parsed = {n: load_text(t, n) for n, t in self.texts.items()}
            return "every file parsed again", True  # equal objects, no route changed
        if what == 14:
            controller = rng.choice(("pilotfish.dev/gateway-controller", "example.com/other"))
            self.put("class.yaml", gateway_class(controller=controller))
            return "gateway class", False
        return "nothing", True


def yaml_of(text: str) -> Obj:
    loaded: Obj = yaml.safe_load(text)
    return loaded


PARTS = ("virtual_services", "gateways", "gateway_api_status", "reference_grants", "warnings")


def _routes_of(world: World) -> dict[tuple[str, str, str], ApiRoute]:
    return {
        (o.kind.value, o.namespace, o.name): o
        for f in world.parsed.values()
        for o in f.parts.gateway_api
        if isinstance(o, ApiRoute)
    }


@pytest.mark.parametrize("seed", [19, 1919, 7])
def test_a_translator_answers_what_a_fresh_translation_answers(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[ApiRoute] = []
    original = translate_module.translate_route

    def counted(ctx: Any, r: ApiRoute) -> Any:
        calls.append(r)
        return original(ctx, r)

    monkeypatch.setattr(translate_module, "translate_route", counted)
    world = World(random.Random(seed))
    before = world.merge(world.translator)
    kinds_seen: set[str] = set()
    for step in range(250):
        routes_before = _routes_of(world)
        what, routes_only = world.change()
        kinds_seen.add(what.split()[0])
        calls.clear()
        got = world.merge(world.translator)
        translated = len(calls)
        want = world.merge(None)
        for part in PARTS:
            assert repr(getattr(got, part)) == repr(getattr(want, part)), f"step {step}: {what}"
        if routes_only:
            # Only the routes that changed were translated again ...
            now = _routes_of(world)
            changed = [
                k
                for k, r in now.items()
                if k not in routes_before
                or routes_before[k] != r
                or routes_before[k].source != r.source
            ]
            assert translated == len(changed), f"step {step}: {what}"
            # ... and every VirtualService equal to one before (source included: a TLS or
            # TCP route moved in its file moves its VirtualService's) is that very object.
            held = {vs.key: vs for vs in before.virtual_services}
            for vs in got.virtual_services:
                was = held.get(vs.key)
                if was is not None and was == vs and was.source == vs.source:
                    assert was is vs, f"step {step}: {what} {vs.key}"
        before = got
    assert {"edit", "move", "drop", "put", "grants", "listeners", "services"} <= kinds_seen
