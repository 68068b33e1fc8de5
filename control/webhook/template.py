"""The sidecar injection template: what injection adds to a pod, read from one YAML file.

The file is `agent-sidecar.yaml` next to this module (examples/kubernetes/ links to it), a
ConfigMap whose `data["sidecar.yaml"]` holds `initContainers`, `containers` and `volumes`; a
file holding that inner document directly is accepted too. In the cluster the control plane
reads the same ConfigMap mounted as a file (`--injection-template`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_TEMPLATE = Path(__file__).with_name("agent-sidecar.yaml")
TEMPLATE_KEY = "sidecar.yaml"
# The agent's container, as Istio names it (kubectl logs -c istio-proxy, probes, tools).
PROXY_CONTAINER = "istio-proxy"


class TemplateError(Exception):
    """The injection template cannot be read or lacks what injection needs."""


@dataclass(frozen=True, slots=True)
class SidecarTemplate:
    """The parts of a pod spec injection adds. Kept as plain JSON-like data (what goes into
    the patch); `copy()` hands out a private deep copy for each pod."""

    containers: tuple[Mapping[str, Any], ...]
    init_containers: tuple[Mapping[str, Any], ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    source: str = ""

    def copy(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """(init containers, containers, volumes), deep-copied."""
        return (
            [copy.deepcopy(dict(c)) for c in self.init_containers],
            [copy.deepcopy(dict(c)) for c in self.containers],
            [copy.deepcopy(dict(v)) for v in self.volumes],
        )


def parse_template(text: str, source: str = "<template>") -> SidecarTemplate:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TemplateError(f"{source}: not YAML: {e}") from None
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        inner = (doc.get("data") or {}).get(TEMPLATE_KEY)
        if not isinstance(inner, str):
            raise TemplateError(f"{source}: ConfigMap has no data[{TEMPLATE_KEY!r}]")
        try:
            doc = yaml.safe_load(inner)
        except yaml.YAMLError as e:
            raise TemplateError(f"{source}: data[{TEMPLATE_KEY!r}]: not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise TemplateError(f"{source}: expected a mapping with containers and volumes")
    containers = _named_list(doc, "containers", source)
    if PROXY_CONTAINER not in {c["name"] for c in containers}:
        raise TemplateError(f"{source}: no container named {PROXY_CONTAINER!r}")
    return SidecarTemplate(
        containers=tuple(containers),
        init_containers=tuple(_named_list(doc, "initContainers", source)),
        volumes=tuple(_named_list(doc, "volumes", source)),
        source=source,
    )


def load_template(path: str | Path = DEFAULT_TEMPLATE) -> SidecarTemplate:
    """Blocking file read; call through asyncio.to_thread on the event loop."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise TemplateError(f"injection template {path}: {e.strerror or e}") from None
    return parse_template(text, str(path))


def _named_list(doc: Mapping[str, Any], key: str, source: str) -> Sequence[dict[str, Any]]:
    value = doc.get(key) or []
    if not isinstance(value, list) or not all(
        isinstance(v, dict) and isinstance(v.get("name"), str) for v in value
    ):
        raise TemplateError(f"{source}: {key} must be a list of objects with a name")
    return value
