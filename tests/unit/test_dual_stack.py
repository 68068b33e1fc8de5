"""Dual stack without sockets: a proxy whose INSTANCE_IPS has an IPv6 address gets its
capture listeners on [::] too (same listener, an additional address); the agent reads
INSTANCE_IPS and sends every pod IP in its node metadata (Envoy's bootstrap included)."""

from __future__ import annotations

import pytest

from agent.config import AgentConfigError, build_parser, config_from_args
from agent.envoy.bootstrap import from_agent_config, node_metadata
from control.generate.listeners_redirect import VIRTUAL_INBOUND, VIRTUAL_OUTBOUND
from control.model.proxy import proxy_from_node
from control.model.types import MeshConfig
from tests.unit.test_generate_virtual import listeners_of


def proxy(ips: str) -> object:
    meta = {"LABELS": {"app": "reviews"}, "INTERCEPTION_MODE": "REDIRECT", "SDS": "true"}
    if ips:
        meta["INSTANCE_IPS"] = ips
    return proxy_from_node("sidecar~10.0.0.9~reviews.default~default.svc.cluster.local", meta)


@pytest.mark.parametrize(
    ("ips", "dual"), [("", False), ("10.0.0.9,fd00::9", True), ("fd00::9", True)]
)
def test_capture_listeners_dual_stack(ips: str, dual: bool) -> None:
    listeners = listeners_of(MeshConfig(), proxy(ips))  # type: ignore[arg-type]
    for name, port in ((VIRTUAL_OUTBOUND, 15001), (VIRTUAL_INBOUND, 15006)):
        listener = listeners[name]
        assert listener.address.socket_address.address == "0.0.0.0"
        extra = [
            (a.address.socket_address.address, a.address.socket_address.port_value)
            for a in listener.additional_addresses
        ]
        assert extra == ([("::", port)] if dual else [])


def test_agent_instance_ips() -> None:
    args = build_parser().parse_args(["--ip", "10.1.2.3"])
    cfg = config_from_args(args, {"INSTANCE_IPS": "10.1.2.3,fd00::3"})
    assert cfg.instance_ips == ("10.1.2.3", "fd00::3")
    assert cfg.node_metadata()["INSTANCE_IPS"] == "10.1.2.3,fd00::3"
    assert node_metadata(from_agent_config(cfg))["INSTANCE_IPS"] == "10.1.2.3,fd00::3"
    # The pod IP is always among them; without the variable it is the only one.
    assert config_from_args(args, {"INSTANCE_IPS": "fd00::3"}).instance_ips == (
        "10.1.2.3",
        "fd00::3",
    )
    assert config_from_args(args, {}).node_metadata()["INSTANCE_IPS"] == "10.1.2.3"
    with pytest.raises(AgentConfigError, match="INSTANCE_IPS: 'x' is not an IP address"):
        config_from_args(args, {"INSTANCE_IPS": "10.1.2.3,x"})
