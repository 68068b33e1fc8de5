"""One Gateway API Gateway's listeners: whether each is valid, its conflicts, the model
`Gateway` made of the valid ones, and the Gateway's status (sans-IO).

A listener is Accepted when its protocol and TLS settings are ones we serve; its refs resolve
when its certificate Secrets are granted and exist and it asks only for route kinds its
protocol carries; it conflicts with an earlier listener of the same port in another protocol
family, or of the same port and hostname. Only a listener that is all three is Programmed,
and only those become servers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from control.model.gateway import Gateway, GatewayServer, ServerTls, ServerTlsMode
from control.model.gatewayapi import (
    GATEWAY_NAME_LABEL,
    GROUP,
    GRPC_ROUTE,
    HTTP_ROUTE,
    SECRET,
    TCP_ROUTE,
    TLS_ROUTE,
    ApiGateway,
    Condition,
    GroupKind,
    Listener,
    ListenerStatus,
    ObjectStatus,
    ReferenceGrant,
    TlsMode,
    reference_granted,
)
from control.model.types import ConfigWarning, Protocol

# Route kinds each listener protocol can carry (and the kinds it allows by default).
_KINDS_BY_PROTOCOL: dict[str, tuple[GroupKind, ...]] = {
    "HTTP": (HTTP_ROUTE, GRPC_ROUTE),
    "HTTPS": (HTTP_ROUTE, GRPC_ROUTE),
    "TLS": (TLS_ROUTE, TCP_ROUTE),
    "TCP": (TCP_ROUTE,),
}
_PROTOCOLS = {
    "HTTP": Protocol.HTTP,
    "HTTPS": Protocol.HTTPS,
    "TLS": Protocol.TLS,
    "TCP": Protocol.TCP,
}


def ok(kind: str, reason: str = "", message: str = "") -> Condition:
    return Condition(kind, True, reason or kind, message)


def bad(kind: str, reason: str, message: str) -> Condition:
    return Condition(kind, False, reason, message)


@dataclass
class ListenerState:
    listener: Listener
    kinds: tuple[GroupKind, ...]
    conditions: dict[str, Condition] = field(default_factory=dict)

    @property
    def programmed(self) -> bool:
        refs = self.conditions["ResolvedRefs"]
        # Kinds it cannot carry are left out; the listener serves the ones it can.
        refs_ok = refs.status or (refs.reason == "InvalidRouteKinds" and bool(self.kinds))
        return (
            self.conditions["Accepted"].status
            and refs_ok
            and not self.conditions["Conflicted"].status
        )


@dataclass
class GatewayState:
    gateway: ApiGateway
    listeners: list[ListenerState]

    @property
    def ref(self) -> str:
        return f"{self.gateway.namespace}/{self.gateway.name}"


def gateway_state(
    gw: ApiGateway,
    grants: tuple[ReferenceGrant, ...],
    secrets: Collection[tuple[str, str]] | None,
) -> GatewayState:
    """Every listener of `gw` judged, conflicts included. `secrets`: the (namespace, name)
    of every known Secret, None when not known (certificateRefs are then not checked)."""
    states = [_listener_state(gw, listener, grants, secrets) for listener in gw.listeners]
    seen: dict[int, ListenerState] = {}
    hosts: dict[tuple[int, str], ListenerState] = {}
    for state in states:
        listener = state.listener
        first = seen.setdefault(listener.port, state)
        if _family(first.listener.protocol) != _family(listener.protocol):
            state.conditions["Conflicted"] = Condition(
                "Conflicted",
                True,
                "ProtocolConflict",
                f"port {listener.port} is already {first.listener.protocol} "
                f"(listener {first.listener.name})",
            )
            continue
        other = hosts.setdefault((listener.port, listener.hostname), state)
        if other is not state:
            state.conditions["Conflicted"] = Condition(
                "Conflicted",
                True,
                "HostnameConflict",
                f"listener {other.listener.name} has the same port and hostname",
            )
    return GatewayState(gw, states)


def _listener_state(
    gw: ApiGateway,
    listener: Listener,
    grants: tuple[ReferenceGrant, ...],
    secrets: Collection[tuple[str, str]] | None,
) -> ListenerState:
    supported = _KINDS_BY_PROTOCOL.get(listener.protocol, ())
    wanted = listener.kinds or supported
    if listener.protocol == "TLS" and not listener.kinds:
        mode = listener.tls_mode or TlsMode.TERMINATE
        wanted = (TLS_ROUTE,) if mode is TlsMode.PASSTHROUGH else (TCP_ROUTE,)
    kinds = tuple(k for k in wanted if k in supported)
    state = ListenerState(listener, kinds)
    cond = state.conditions
    cond["Conflicted"] = bad("Conflicted", "NoConflicts", "")
    if listener.protocol not in _PROTOCOLS:
        cond["Accepted"] = bad(
            "Accepted", "UnsupportedProtocol", f"protocol {listener.protocol} is not supported"
        )
    elif problem := _tls_problem(listener):
        cond["Accepted"] = bad("Accepted", "UnsupportedValue", problem)
    else:
        cond["Accepted"] = ok("Accepted")
    cond["ResolvedRefs"] = _listener_refs(gw, listener, kinds, grants, secrets)
    return state


def _listener_refs(
    gw: ApiGateway,
    listener: Listener,
    kinds: tuple[GroupKind, ...],
    grants: tuple[ReferenceGrant, ...],
    secrets: Collection[tuple[str, str]] | None,
) -> Condition:
    for ref in listener.certificate_refs if _terminates(listener) else ():
        what = f"certificateRef {ref.namespace}/{ref.name}"
        if (ref.group, ref.kind) != SECRET:
            return bad("ResolvedRefs", "InvalidCertificateRef", f"{what}: not a Secret")
        granted = reference_granted(
            grants,
            (GROUP, "Gateway", gw.namespace),
            ("", "Secret", ref.namespace, ref.name),
        )
        if not granted:
            return bad(
                "ResolvedRefs",
                "RefNotPermitted",
                f"{what}: no ReferenceGrant in {ref.namespace} allows it",
            )
        if secrets is not None and (ref.namespace, ref.name) not in secrets:
            return bad("ResolvedRefs", "InvalidCertificateRef", f"{what}: no such Secret")
    unsupported = [k for k in listener.kinds if k not in kinds]
    if unsupported:
        names = ", ".join(k for _, k in unsupported)
        return bad("ResolvedRefs", "InvalidRouteKinds", f"route kinds {names} not supported")
    return ok("ResolvedRefs")


def model_gateway(state: GatewayState, warnings: list[ConfigWarning]) -> Gateway:
    """The model Gateway: one server per Programmed listener."""
    gw = state.gateway
    servers: list[GatewayServer] = []
    for ls in state.listeners:
        if not ls.programmed:
            continue
        listener = ls.listener
        servers.append(
            GatewayServer(
                port=listener.port,
                protocol=_PROTOCOLS[listener.protocol],
                port_name=listener.name,
                hosts=(f"*/{listener.hostname or '*'}",),
                tls=_server_tls(gw, listener, warnings),
                name=listener.name,
            )
        )
    return Gateway(
        namespace=gw.namespace,
        name=gw.name,
        source=gw.source,
        selector=((GATEWAY_NAME_LABEL, gw.name),),
        servers=tuple(servers),
        router_namespace=gw.namespace,
    )


def _server_tls(
    gw: ApiGateway, listener: Listener, warnings: list[ConfigWarning]
) -> ServerTls | None:
    if listener.protocol not in ("HTTPS", "TLS"):
        return None
    if listener.tls_mode is TlsMode.PASSTHROUGH:
        return ServerTls(mode=ServerTlsMode.PASSTHROUGH)
    refs = listener.certificate_refs
    if len(refs) > 1:
        warnings.append(
            ConfigWarning(
                gw.source,
                f"listener {listener.name}: only the first certificateRef is served",
            )
        )
    ref = refs[0]
    name = ref.name if ref.namespace == gw.namespace else f"{ref.namespace}/{ref.name}"
    return ServerTls(mode=ServerTlsMode.SIMPLE, credential_name=name)


def gateway_status(state: GatewayState, attached: Sequence[int]) -> ObjectStatus:
    """The Gateway's conditions and one status per listener; `attached`: how many routes
    each listener (by position) has attached."""
    listeners = []
    for ls, count in zip(state.listeners, attached, strict=True):
        programmed = (
            ok("Programmed")
            if ls.programmed
            else bad("Programmed", "Invalid", "the listener is not valid (see its conditions)")
        )
        listeners.append(
            ListenerStatus(
                name=ls.listener.name,
                supported_kinds=ls.kinds,
                attached_routes=count,
                conditions=(
                    ls.conditions["Accepted"],
                    ls.conditions["ResolvedRefs"],
                    ls.conditions["Conflicted"],
                    programmed,
                ),
            )
        )
    valid = [ls for ls in state.listeners if ls.programmed]
    if len(valid) == len(state.listeners):
        accepted = ok("Accepted")
    else:
        accepted = Condition(
            "Accepted", True, "ListenersNotValid", "some listeners are not valid; see listeners"
        )
    programmed = ok("Programmed") if valid else bad("Programmed", "Invalid", "no listener is valid")
    gw = state.gateway
    return ObjectStatus(
        "Gateway",
        gw.namespace,
        gw.name,
        gw.generation,
        conditions=(accepted, programmed),
        listeners=tuple(listeners),
    )


def _terminates(listener: Listener) -> bool:
    return listener.protocol == "HTTPS" or (
        listener.protocol == "TLS" and listener.tls_mode is not TlsMode.PASSTHROUGH
    )


def _family(protocol: str) -> str:
    # HTTPS and TLS share a port by SNI; HTTP and TCP need a port each.
    return {"HTTPS": "TLS"}.get(protocol, protocol)


def _tls_problem(listener: Listener) -> str:
    if listener.protocol in ("HTTP", "TCP") and listener.tls_mode is not None:
        return f"tls is not allowed on a {listener.protocol} listener"
    if listener.protocol == "HTTPS" and listener.tls_mode is TlsMode.PASSTHROUGH:
        return "an HTTPS listener terminates TLS (use protocol TLS for Passthrough)"
    if _terminates(listener) and not listener.certificate_refs:
        return "tls.certificateRefs is required to terminate TLS"
    if listener.protocol == "TLS" and listener.tls_mode is None:
        return "tls.mode is required on a TLS listener"
    return ""
