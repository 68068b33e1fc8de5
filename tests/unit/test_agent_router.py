"""`pilotfish-agent --proxy-type router`: a gateway's node identity, bootstrap and what the
agent leaves out for it (the DNS proxy is a sidecar's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.app import Agent
from agent.config import AgentConfigError, build_parser, config_from_args
from agent.envoy.bootstrap import build_bootstrap, from_agent_config


def router_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--proxy-type",
        "router",
        "--ip",
        "127.0.1.9",
        "--pod-name",
        "ingress-1",
        "--namespace",
        "istio-system",
        "--workdir",
        str(tmp_path / "run"),
        "--labels",
        "istio=ingressgateway",
        *extra,
    ]


def test_router_node_id_is_istios() -> None:
    cfg = config_from_args(build_parser().parse_args(router_args(Path("/tmp"))), {})
    assert cfg.is_router
    assert cfg.node_id == "router~127.0.1.9~ingress-1.istio-system~istio-system.svc.cluster.local"


def test_router_bootstrap_names_the_router_node(tmp_path: Path) -> None:
    cfg = config_from_args(build_parser().parse_args(router_args(tmp_path)), {})
    boot = build_bootstrap(from_agent_config(cfg))
    assert boot["node"]["id"] == cfg.node_id
    assert boot["node"]["id"].startswith("router~")
    # SDS, the readiness and Prometheus listeners are there as for a sidecar.
    names = {c["name"] for c in boot["static_resources"]["clusters"]}
    assert {"xds-grpc", "sds-grpc", "agent"} <= names
    assert boot["node"]["metadata"]["LABELS"] == {"istio": "ingressgateway"}


def test_sidecar_is_the_default() -> None:
    cfg = config_from_args(build_parser().parse_args([]), {})
    assert not cfg.is_router
    assert cfg.node_id.startswith("sidecar~")


def test_router_cannot_be_proxy_only(tmp_path: Path) -> None:
    args = build_parser().parse_args(router_args(tmp_path, "--proxy-only"))
    with pytest.raises(AgentConfigError, match="proxy-only"):
        config_from_args(args, {})


def test_unknown_proxy_type_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--proxy-type", "waypoint"])


def test_router_runs_no_dns_proxy(tmp_path: Path) -> None:
    cfg = config_from_args(build_parser().parse_args(router_args(tmp_path)), {})
    assert cfg.dns_port != 0
    agent = Agent(cfg)
    # Readiness waits for no name table, and nothing listens on the DNS port.
    assert agent.dns is None and agent.names is None
    sidecar = Agent(config_from_args(build_parser().parse_args([]), {}))
    assert sidecar.dns is not None
