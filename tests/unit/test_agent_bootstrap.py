"""The Envoy bootstrap the agent writes: identity, clusters, static listeners, file handling,
and acceptance by the real Envoy (`--mode validate`)."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.envoy.bootstrap import (
    ADS_RETRY,
    AGENT_CLUSTER,
    PROMETHEUS_CLUSTER,
    SDS_CLUSTER,
    XDS_CLUSTER,
    BootstrapOptions,
    bootstrap_json,
    build_bootstrap,
    from_agent_config,
    write_bootstrap,
)
from tests.support.envoy import envoy_binary


def agent_config(tmp_path: Path, **kw: Any) -> AgentConfig:
    base: dict[str, Any] = dict(
        workdir=tmp_path / "run",
        ip="127.0.1.7",
        pod_name="web-1",
        namespace="shop",
        service_account="web-sa",
        labels={"app": "web", "version": "v1"},
        extra_metadata={"MESH_ID": "m1"},
    )
    base.update(kw)
    return AgentConfig(**base)


def clusters(boot: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in boot["static_resources"]["clusters"]}


def listeners(boot: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["name"]: x for x in boot["static_resources"].get("listeners", [])}


def endpoint_address(cluster: dict[str, Any]) -> dict[str, Any]:
    lb = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert len(lb) == 1
    address: dict[str, Any] = lb[0]["endpoint"]["address"]
    return address


def routes(listener: dict[str, Any]) -> list[dict[str, Any]]:
    (chain,) = listener["filter_chains"]
    (hcm,) = chain["filters"]
    (vhost,) = hcm["typed_config"]["route_config"]["virtual_hosts"]
    result: list[dict[str, Any]] = vhost["routes"]
    return result


def test_node_identity_and_metadata(tmp_path: Path) -> None:
    boot = build_bootstrap(from_agent_config(agent_config(tmp_path)))
    node = boot["node"]
    assert node["id"] == "sidecar~127.0.1.7~web-1.shop~shop.svc.cluster.local"
    assert node["cluster"] == "web.shop"
    meta = node["metadata"]
    assert meta["NAME"] == "web-1"
    assert meta["NAMESPACE"] == "shop"
    assert meta["INSTANCE_IPS"] == "127.0.1.7"
    assert meta["SERVICE_ACCOUNT"] == "web-sa"
    assert meta["LABELS"] == {"app": "web", "version": "v1"}
    assert meta["INTERCEPTION_MODE"] == "NONE"
    assert meta["MESH_ID"] == "m1"  # ISTIO_META_* passes through


def test_node_id_matches_agent_config(tmp_path: Path) -> None:
    cfg = agent_config(tmp_path, cluster_domain="corp.example")
    assert from_agent_config(cfg).node_id == cfg.node_id
    meta = build_bootstrap(from_agent_config(cfg))["node"]["metadata"]
    assert meta == cfg.node_metadata()


@pytest.mark.parametrize("delta", [False, True])
def test_ads_over_the_workdir_xds_socket(tmp_path: Path, delta: bool) -> None:
    cfg = agent_config(tmp_path, envoy_delta=delta)
    boot = build_bootstrap(from_agent_config(cfg))
    ads = boot["dynamic_resources"]["ads_config"]
    assert ads["api_type"] == ("DELTA_GRPC" if delta else "GRPC")
    # Envoy may dial before the agent has bound the socket: it tries again within 20 ms.
    assert ads["grpc_services"] == [
        {"envoy_grpc": {"cluster_name": XDS_CLUSTER, "retry_policy": ADS_RETRY}}
    ]
    assert ADS_RETRY["retry_back_off"]["base_interval"] == "0.02s"
    for kind in ("cds_config", "lds_config"):
        assert boot["dynamic_resources"][kind]["ads"] == {}
    xds = clusters(boot)[XDS_CLUSTER]
    assert endpoint_address(xds) == {"pipe": {"path": str((tmp_path / "run" / "XDS").absolute())}}
    assert "http2_protocol_options" in json.dumps(xds["typed_extension_protocol_options"])


def test_sds_cluster_on_the_workdir_sds_socket(tmp_path: Path) -> None:
    boot = build_bootstrap(from_agent_config(agent_config(tmp_path)))
    sds = clusters(boot)[SDS_CLUSTER]
    assert sds["type"] == "STATIC"
    assert endpoint_address(sds) == {"pipe": {"path": str((tmp_path / "run" / "SDS").absolute())}}
    assert "http2_protocol_options" in json.dumps(sds["typed_extension_protocol_options"])


def test_admin_on_the_pod_ip(tmp_path: Path) -> None:
    opts = from_agent_config(agent_config(tmp_path, envoy_admin_port=15999))
    boot = build_bootstrap(opts)
    assert boot["admin"]["address"] == {
        "socket_address": {"address": "127.0.1.7", "port_value": 15999}
    }
    assert opts.admin_url == "http://127.0.1.7:15999"
    assert BootstrapOptions(ip="::1", pod_name="p").admin_url == "http://[::1]:15000"


def test_readiness_listener_forwards_to_the_agent(tmp_path: Path) -> None:
    boot = build_bootstrap(from_agent_config(agent_config(tmp_path, status_port=15020)))
    readiness = next(
        x for x in listeners(boot).values() if x["address"]["socket_address"]["port_value"] == 15021
    )
    assert readiness["address"]["socket_address"]["address"] == "127.0.1.7"
    assert "virtualInbound" not in readiness["name"]
    hcm = readiness["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["stat_prefix"] == "agent"
    first, rest = routes(readiness)[0], routes(readiness)[1:]
    assert first["match"] == {"prefix": "/healthz/ready"}
    assert first["route"] == {"cluster": AGENT_CLUSTER}
    assert [r["direct_response"]["status"] for r in rest] == [404]
    agent = clusters(boot)[AGENT_CLUSTER]
    assert endpoint_address(agent) == {
        "socket_address": {"address": "127.0.1.7", "port_value": 15020}
    }


def test_prometheus_listener_forwards_to_the_admin(tmp_path: Path) -> None:
    boot = build_bootstrap(from_agent_config(agent_config(tmp_path)))
    prom = next(
        x for x in listeners(boot).values() if x["address"]["socket_address"]["port_value"] == 15090
    )
    assert prom["address"]["socket_address"]["address"] == "127.0.1.7"
    assert routes(prom)[0] == {
        "match": {"prefix": "/stats/prometheus"},
        "route": {"cluster": PROMETHEUS_CLUSTER},
    }
    assert endpoint_address(clusters(boot)[PROMETHEUS_CLUSTER]) == boot["admin"]["address"]


def test_direct_tcp_bootstrap_keeps_its_old_shape() -> None:
    """The form tests and the demo use: TCP ADS, no SDS, no readiness listener."""
    boot = build_bootstrap(
        BootstrapOptions(
            ip="127.0.1.9", pod_name="client", labels={"app": "client"}, xds_address="127.0.0.1:99"
        )
    )
    assert endpoint_address(clusters(boot)[XDS_CLUSTER]) == {
        "socket_address": {"address": "127.0.0.1", "port_value": 99}
    }
    assert set(clusters(boot)) == {XDS_CLUSTER, PROMETHEUS_CLUSTER}
    assert len(listeners(boot)) == 1
    no_prom = build_bootstrap(BootstrapOptions(ip="127.0.1.9", pod_name="c", prometheus_port=None))
    assert set(clusters(no_prom)) == {XDS_CLUSTER}
    assert "listeners" not in no_prom["static_resources"]


def test_write_bootstrap_is_atomic_and_world_readable(tmp_path: Path) -> None:
    opts = from_agent_config(agent_config(tmp_path))
    path = tmp_path / "envoy-rev.json"
    path.write_text("old")
    path.chmod(0o600)
    assert write_bootstrap(path, opts) == path
    assert json.loads(path.read_text()) == build_bootstrap(opts)
    assert path.read_text() == bootstrap_json(opts)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name != "run"] == ["envoy-rev.json"]


def test_write_bootstrap_leaves_no_temp_file_on_failure(tmp_path: Path) -> None:
    opts = from_agent_config(agent_config(tmp_path))
    target = tmp_path / "dir-in-the-way"
    target.mkdir()
    with pytest.raises(OSError):
        write_bootstrap(target, opts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir-in-the-way"]


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--log-level", "warn"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.envoy
@pytest.mark.parametrize("delta", [False, True])
def test_real_envoy_accepts_the_agent_bootstrap(tmp_path: Path, delta: bool) -> None:
    cfg = agent_config(tmp_path, envoy_delta=delta)
    path = write_bootstrap(tmp_path / "envoy-rev.json", from_agent_config(cfg))
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.envoy
def test_real_envoy_rejects_a_broken_bootstrap(tmp_path: Path) -> None:
    """The validation above is not vacuous."""
    boot = build_bootstrap(from_agent_config(agent_config(tmp_path)))
    boot["static_resources"]["clusters"].append(boot["static_resources"]["clusters"][0])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(boot))
    assert validate(path).returncode != 0


def test_interception_mode_flag_reaches_node_metadata(tmp_path: Path) -> None:
    from agent.config import AgentConfigError, build_parser, config_from_args

    def parse(*argv: str, env: dict[str, str] | None = None) -> AgentConfig:
        args = build_parser().parse_args(["--workdir", str(tmp_path), *argv])
        return config_from_args(args, env or {})

    assert parse().interception_mode == "NONE"
    cfg = parse("--interception-mode", "redirect")
    assert cfg.redirect and cfg.node_metadata()["INTERCEPTION_MODE"] == "REDIRECT"
    boot = build_bootstrap(from_agent_config(cfg))
    assert boot["node"]["metadata"]["INTERCEPTION_MODE"] == "REDIRECT"
    # ISTIO_META_INTERCEPTION_MODE is the flag's default, not extra metadata that could
    # contradict it.
    args = build_parser().parse_args(["--workdir", str(tmp_path)])
    args.interception_mode = "TPROXY"
    with pytest.raises(AgentConfigError, match="--interception-mode: 'TPROXY'"):
        config_from_args(args, {})
    env_cfg = parse(env={"ISTIO_META_INTERCEPTION_MODE": "NONE"})
    assert "INTERCEPTION_MODE" not in env_cfg.extra_metadata


def test_workload_group_flag_reaches_node_metadata(tmp_path: Path) -> None:
    from agent.config import AgentConfigError, build_parser, config_from_args

    def parse(*argv: str, env: dict[str, str] | None = None) -> AgentConfig:
        args = build_parser().parse_args(["--workdir", str(tmp_path), *argv])
        return config_from_args(args, env or {})

    assert "WORKLOAD_GROUP" not in parse().node_metadata()
    cfg = parse("--workload-group", "reviews")
    assert cfg.node_metadata()["WORKLOAD_GROUP"] == "reviews"
    boot = build_bootstrap(from_agent_config(cfg))
    assert boot["node"]["metadata"]["WORKLOAD_GROUP"] == "reviews"
    # Istio's environment variable becomes node metadata by the ISTIO_META_* rule; the flag
    # wins over it.
    env = {"ISTIO_META_WORKLOAD_GROUP": "ratings"}
    assert parse(env=env).node_metadata()["WORKLOAD_GROUP"] == "ratings"
    assert parse("--workload-group", "reviews", env=env).node_metadata()["WORKLOAD_GROUP"] == (
        "reviews"
    )
    with pytest.raises(AgentConfigError, match="--workload-group: 'Bad/Name'"):
        parse("--workload-group", "Bad/Name")
