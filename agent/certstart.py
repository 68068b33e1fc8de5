"""The agent's workload certificate: its source (a `SecretManager` signing over the upstream
channel), the SDS server that hands it to Envoy and, in proxy-only mode, the files proxyless
apps read it from; made from the agent's config.

Its own module, apart from agent/app.py, because `agent/__main__.py` makes and starts them
before importing the rest of the agent (agent/launch.py, `Launch.start_certs`): the key,
the CSR and the signing round trip then go on while the rest is imported, and Envoy's SDS
requests are answered as soon as the certificate is there. What it imports (the CA protos,
agent/sds) the agent needs anyway; cryptography is not among it (agent/sds/keywork.py).
"""

from __future__ import annotations

from collections.abc import Awaitable

from agent.config import AgentConfig
from agent.metrics import AgentMetrics, SdsMetricsObserver
from agent.sds.caclient import CaClient
from agent.sds.certfiles import CertFileWriter, CertPaths
from agent.sds.keyspec import KeyType
from agent.sds.keywork import KeyWork
from agent.sds.remote import RemoteSecrets
from agent.sds.secrets import SdsConfig, SecretManager
from agent.sds.server import SdsServer
from agent.sds.workloadcert import SdsStats, WorkloadCert
from agent.unixsocket import UnixGrpcServer
from agent.xdsproxy.upstream import UpstreamChannel


def workload_secrets(
    cfg: AgentConfig,
    upstream: UpstreamChannel,
    metrics: AgentMetrics,
    first: Awaitable[WorkloadCert] | None = None,
    keys: KeyWork | None = None,
) -> SecretManager:
    """Workload certificates signed over `upstream`, served to Envoy (and proxyless clients)
    as SDS `default` / `ROOTCA` on <workdir>/SDS; counted in `metrics`. `first`: the first
    signing attempt, when the launch started it (agent/launch.py); `keys`: where keys are
    made (the key worker, when the agent forked one)."""
    return SecretManager(
        CaClient(upstream, cfg.token_file),
        SdsConfig(
            trust_domain=cfg.trust_domain,
            namespace=cfg.namespace,
            service_account=cfg.service_account,
            key_type=KeyType(cfg.key_type),
            cert_ttl=cfg.workload_cert_ttl,
        ),
        stats=SdsStats(observer=SdsMetricsObserver(metrics)),
        # Gateway certificates (`kubernetes://<name>`): fetched from the control plane on
        # the same channel, one stream each, for whichever the control plane allows.
        remote=RemoteSecrets(
            lambda: upstream.ads(delta=False),
            node_id=cfg.node_id,
            metadata={**cfg.node_metadata(), "SDS_FETCH": "true"},
        ),
        first=first,
        keys=keys,
    )


class WorkloadCerts:
    """The secret manager, the SDS server and (proxy-only) the certificate files, started
    and closed together."""

    def __init__(
        self,
        cfg: AgentConfig,
        upstream: UpstreamChannel,
        metrics: AgentMetrics,
        *,
        owner: int | None = None,
        server: UnixGrpcServer | None = None,
        first: Awaitable[WorkloadCert] | None = None,
        keys: KeyWork | None = None,
    ) -> None:
        """`owner`: the UID that may use the SDS socket (Envoy's, when it runs as another
        user); `server`: that socket, when it was bound beforehand (agent/launch.py);
        `first`: the first signing attempt, when the launch started it; `keys`: where keys
        are made."""
        self.secrets = workload_secrets(cfg, upstream, metrics, first, keys)
        self.sds = SdsServer(cfg.sds_socket, self.secrets, owner=owner, server=server)
        # Proxyless apps read the certificate from files (gRPC has no SDS).
        self.cert_files: CertFileWriter | None = None
        if cfg.proxy_only:
            self.cert_files = CertFileWriter(self.secrets, CertPaths(cfg.grpc_cert_dir))
        self._started = False

    async def start(self) -> None:
        """Key, CSR and the signing call go on in the background from here (idempotent)."""
        if self._started:
            return
        self._started = True
        await self.secrets.start()
        await self.sds.start()
        if self.cert_files is not None:
            await self.cert_files.start()

    async def close(self) -> None:
        """Idempotent (the agent closes the three itself, in its own order, first)."""
        await self.sds.close()
        if self.cert_files is not None:
            await self.cert_files.close()
        await self.secrets.close()
