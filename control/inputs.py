"""Which inputs the options name: the config source (files, or the Kubernetes API) and the
mesh config's inputs (the ConfigMap `istio`, `--mesh-config`, the flags on top). The rest of
the control plane sees only the `ConfigSource` / `MeshConfigSource` protocols.
"""

from __future__ import annotations

import os

from control.config.meshwatch import EffectiveMeshConfig, MeshConfigFile, MeshInput
from control.config.source import ConfigSource
from control.config.watcher import ConfigWatcher
from control.debugaccess import own_namespace
from control.kube.client import kube_config
from control.kube.meshconfig import KubeMeshConfig
from control.kube.source import KubeSource
from control.metrics import Metrics
from control.options import ControlPlaneOptions


def config_source(options: ControlPlaneOptions, metrics: Metrics) -> ConfigSource:
    """A KubeSource in Kubernetes mode (its watch events counted as Istio's
    pilot_k8s_{reg,cfg}_events), else a ConfigWatcher of the config paths. KubeConfigError:
    a bad kubeconfig."""
    if options.kubernetes:

        def on_events(source: str, kind: str, event: str, n: int) -> None:
            counter = metrics.k8s_reg_events if source == "registry" else metrics.k8s_cfg_events
            counter.labels(kind, event).inc(n)

        return KubeSource(
            kube_config(options.kubeconfig),
            domain=options.trust_domain,
            on_events=on_events,
            revision=options.revision,
        )
    return ConfigWatcher(
        list(options.config_paths),
        debounce=options.config_settle,
        poll_interval=options.config_poll_interval,
        domain=options.trust_domain,
        revision=options.revision,
    )


def mesh_source(options: ControlPlaneOptions, source: ConfigSource) -> EffectiveMeshConfig:
    """The mesh config inputs, first match wins: the ConfigMap `istio` in the control
    plane's namespace (Kubernetes mode), then `--mesh-config`; flags on top."""
    inputs: list[MeshInput] = []
    client = source.kube_client
    if client is not None:
        inputs.append(KubeMeshConfig(client, own_namespace(True, os.environ)))
    if options.mesh_config:
        inputs.append(
            MeshConfigFile(
                options.mesh_config,
                poll_interval=options.config_poll_interval,
                debounce=options.config_settle,
            )
        )
    return EffectiveMeshConfig(inputs, options.mesh_overrides())
