"""What a control plane is started with: `ControlPlaneOptions` (flags land here through
`__main__`; library users and tests build it directly), and the parts of it that the security
stack and the mesh config take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from control.ca.authority import SERVING_VALIDITY
from control.debugaccess import DebugAllow
from control.gcsettings import DEFAULT_YOUNG_THRESHOLD
from control.kube.rootcert import DEFAULT_EXCLUDED
from control.model.meshconfig import MeshOverrides
from control.security import SecurityOptions
from control.xds.options import XdsOptions


@dataclass(frozen=True, slots=True)
class ControlPlaneOptions:
    config_paths: tuple[str, ...] = ()
    xds_address: str = "127.0.0.1:15010"
    # TLS gRPC (ADS + CA) with a serving certificate from our own CA; "" = not served. The
    # CLI default is 127.0.0.1:15012; here it is off so that library users and tests do not
    # collide on a fixed port.
    secure_xds_address: str = ""
    # TLS gRPC that requires a client certificate issued by our CA ("" = not served). A
    # separate listener because grpcio can only either not ask for a client certificate or
    # require one; the token port must not require one (an agent has no cert before its
    # first CreateCertificate).
    mtls_xds_address: str = ""
    http_address: str = "127.0.0.1:15014"
    # Empty: nothing is persisted (tests): the CA root and the token key then live in memory
    # for the life of the process.
    state_dir: str = ""
    ca_cert: str = ""  # plugged-in CA: signing certificate (root or intermediate) ...
    ca_key: str = ""  # ... its key ...
    ca_chain: str = ""  # ... and the certificates above it, root last
    max_workload_cert_ttl: float = 24 * 3600.0
    # Lifetime of the control plane's own TLS certificates (TLS gRPC ports, webhook), seconds;
    # each is issued again at half its lifetime (control/ca/serving.py).
    serving_cert_ttl: float = SERVING_VALIDITY.total_seconds()
    trust_domain: str = "cluster.local"
    # Mesh-wide ALLOW_ANY | REGISTRY_ONLY for REDIRECT proxies (a Sidecar may override it).
    outbound_traffic_policy: str = "ALLOW_ANY"
    id: str = "pilotfish"
    debounce_quiet: float = 0.1
    debounce_max: float = 10.0
    workload_grace: float = 10.0
    config_poll_interval: float = 0.25
    # Files must be quiet this long before they are re-read (a writer may still be writing).
    config_settle: float = 0.05
    # Config from the Kubernetes API instead of files: in-cluster credentials, or the
    # kubeconfig file given (control/kube/). Pods are the workloads; proxies do not
    # auto-register.
    kubernetes: bool = False
    kubeconfig: str = ""
    # Sidecar injection webhook (HTTPS, certificate from our CA); "" = not served. The CLI
    # default is 127.0.0.1:15017; the Kubernetes manifests serve it on 0.0.0.0:15017.
    webhook_address: str = ""
    injection_template: str = ""  # "" = control/webhook/agent-sidecar.yaml
    injection_image: str = ""  # "" = the template's image
    injection_pilot_address: str = ""  # "" = the template's PILOT_ADDRESS
    injection_hold_application: bool = False  # defaultConfig.holdApplicationUntilProxyStarts
    injection_native_sidecars: bool = False  # Istio's ENABLE_NATIVE_SIDECARS
    # Istio-style revision ("" = the default): injects only its pods (webhook/decision.py).
    revision: str = ""
    # Kubernetes mode: the MutatingWebhookConfiguration whose caBundle we keep equal to our
    # root ("" = not patched).
    webhook_config_name: str = ""
    # Kubernetes mode: namespaces that get no istio-ca-root-cert ConfigMap (Istio's system
    # namespaces by default).
    root_cert_excluded_namespaces: frozenset[str] = DEFAULT_EXCLUDED
    # --debug-allow: who may read /debug/* off loopback and all of syncz over TLS xDS (None:
    # the control plane's own namespace); whether /debug/* needs that (None: judged by
    # http_address, loopback is open; tests force it).
    debug_allow: DebugAllow | None = None
    debug_requires_auth: bool | None = None
    # The dashboard at /ui/ (--ui); where its graph reads metrics: a Prometheus (its HTTP API)
    # or, "", the connected agents' status ports, scraped by the control plane itself.
    ui: bool = True
    prometheus_url: str = ""
    xds: XdsOptions = field(default_factory=XdsOptions)
    # The garbage collector's generation-0 threshold while the control plane runs
    # (control/gcsettings.py: a push allocates a burst per stream, and with the
    # interpreter's 700 the collector ran a few times in every push). None: the
    # interpreter's own setting is left alone.
    gc_young_threshold: int | None = DEFAULT_YOUNG_THRESHOLD
    # Istio MeshConfig YAML ("" = none; Kubernetes mode also reads the ConfigMap `istio`).
    mesh_config: str = ""
    # Which options were given as flags and so win over the mesh config (names of the
    # fields above: outbound_traffic_policy, injection_hold_application). None: every one
    # that differs from its default (library use).
    flags_given: frozenset[str] | None = None

    def mesh_overrides(self) -> MeshOverrides:
        """What the mesh config may not change. The trust domain is always the one the
        process starts with (__main__ takes it from the mesh file when no flag says):
        certificates and SPIFFE identities are issued under it."""
        given = self.flags_given
        if given is None:
            defaults = ControlPlaneOptions()
            given = frozenset(
                name
                for name in ("outbound_traffic_policy", "injection_hold_application")
                if getattr(self, name) != getattr(defaults, name)
            )
        return MeshOverrides(
            trust_domain=self.trust_domain,
            outbound_traffic_policy=self.outbound_traffic_policy
            if "outbound_traffic_policy" in given
            else None,
            hold_application_until_proxy_starts=True
            if "injection_hold_application" in given and self.injection_hold_application
            else None,
        )

    def security(self) -> SecurityOptions:
        return SecurityOptions(
            trust_domain=self.trust_domain,
            state_dir=self.state_dir,
            ca_cert=self.ca_cert,
            ca_key=self.ca_key,
            ca_chain=self.ca_chain,
            max_workload_cert_ttl=self.max_workload_cert_ttl,
            serving_cert_ttl=self.serving_cert_ttl,
            secure_address=self.secure_xds_address,
            mtls_address=self.mtls_xds_address,
            replica_id=self.id,
            revision=self.revision,
        )
