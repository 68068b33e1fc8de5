"""The readiness probe of a WorkloadGroup member, for its node agent
(`pilotfish.health.v1.WorkloadProbe`, protos/probe.proto; issue 18).

The channel: the agent subscribes to this type on its own ADS stream (the one upstream
connection it already has, authenticated like every stream of the proxy); the resource is
the probe of the group the proxy's node names, one resource named `<namespace>/<group>`, and
none when the group does not exist or has no probe (the agent then stops probing). Istio
sends the same probe to its agent in the proxy's static config; over xDS a changed probe
reaches running agents with the next full push (WorkloadGroups are among the rules a full
push is built from, model/index.py `rules_of`).

The probe is not secret: a proxy that names a group it may not join still gets it (it is what
the group's members run), but its health reports count for nothing
(control/registry/autoregister.py).
"""

from __future__ import annotations

from control.generate.context import GenContext
from control.model.proxy import Proxy
from control.model.workloadgroup import WorkloadGroup, WorkloadProbe
from control.xds.cache import EMPTY, ResourceSet
from protos import probe_pb2
from protos.typeurls import WORKLOAD_PROBE


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    if not proxy.workload_group:
        return EMPTY
    groups = ctx.memo(("probe-groups",), lambda: _groups(ctx))
    group = groups.get((proxy.namespace, proxy.workload_group))
    if group is None or group.probe is None:
        return EMPTY
    probe = group.probe
    name = f"{group.namespace}/{group.name}"
    return ctx.memo(
        ("probe-set", name, probe),
        lambda: ResourceSet([ctx.resource(WORKLOAD_PROBE, name, probe, lambda: build(probe))]),
    )


def _groups(ctx: GenContext) -> dict[tuple[str, str], WorkloadGroup]:
    return {g.key: g for g in ctx.index.config.workload_groups}


def build(probe: WorkloadProbe) -> probe_pb2.WorkloadProbe:
    msg = probe_pb2.WorkloadProbe(
        initial_delay_seconds=probe.initial_delay_seconds,
        timeout_seconds=probe.timeout_seconds,
        period_seconds=probe.period_seconds,
        success_threshold=probe.success_threshold,
        failure_threshold=probe.failure_threshold,
    )
    if probe.kind == "httpGet":
        msg.http_get.CopyFrom(
            probe_pb2.HttpGet(
                path=probe.path,
                port=probe.port,
                host=probe.host,
                scheme=probe.scheme,
                headers=dict(probe.headers),
            )
        )
    elif probe.kind == "tcpSocket":
        msg.tcp_socket.CopyFrom(probe_pb2.TcpSocket(host=probe.host, port=probe.port))
    elif probe.kind == "exec":
        msg.exec.CopyFrom(probe_pb2.Exec(command=list(probe.command)))
    else:
        msg.grpc.CopyFrom(probe_pb2.Grpc(port=probe.port, service=probe.service))
    return msg
