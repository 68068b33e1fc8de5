"""Certificate metrics: the secret manager's events through SdsMetricsObserver into the
agent's Prometheus registry, read back from the rendered exposition."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import AgentMetrics, SdsMetricsObserver
from agent.sds.rotation import RotationPolicy
from agent.sds.secrets import SdsConfig, SecretManager
from agent.sds.signer import SigningError
from agent.sds.workloadcert import SdsStats
from tests.support.controlplane import eventually
from tests.support.testca import TestCA


def samples(metrics: AgentMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_certificate_events_become_prometheus_metrics(tmp_path: Path) -> None:
    metrics = AgentMetrics()
    stats = SdsStats(observer=SdsMetricsObserver(metrics))
    ca = TestCA(failures=[SigningError("CA down")])
    cfg = SdsConfig(
        cert_ttl=3600,
        rotation=RotationPolicy(retry_initial=0.05, retry_max=0.1),
        file_poll_interval=0.05,
    )
    before = samples(metrics)
    assert before[("istio_agent_cert_expiry_seconds", (("resource_name", "default"),))] == 0
    async with SecretManager(ca, cfg, stats=stats) as manager:
        assert await manager.wait_ready(10)
        manager.rotate_now()
        await eventually(lambda: stats.rotations == 1, what="rotation")
        await manager.acquire(f"file-root:{tmp_path / 'missing.pem'}")
        got = samples(metrics)
    csr = (("request_type", "csr"),)
    assert got[("istio_agent_num_outgoing_requests_total", csr)] == 3
    assert got[("istio_agent_num_failed_outgoing_requests_total", csr)] == 1
    assert got[("pilotfish_agent_certs_issued_total", ())] == 2
    assert got[("pilotfish_agent_cert_rotations_total", ())] == 1
    assert got[("istio_agent_num_file_secret_failures_total", ())] == 1
    expiry = got[("istio_agent_cert_expiry_seconds", (("resource_name", "default"),))]
    assert manager.expiry is not None
    assert 3500 < expiry <= manager.expiry - time.time() + 1
