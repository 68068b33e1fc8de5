"""The one interface every config source implements (files: `ConfigWatcher`; the Kubernetes
API: `KubeSource`), so the control plane is wired the same way whichever one runs and nothing
downstream asks which kind it holds.

It decides what a consumer may rely on: when the first config is there, how later ones are
handed over, and which side facts (namespace labels, an API client) a source may offer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from control.config.delivery import ChangeHandler
from control.config.errors import ConfigError
from control.model.meshconfig import MeshSettings
from control.model.types import MeshConfig

if TYPE_CHECKING:
    from control.kube.client import KubeClient

__all__ = ["ChangeHandler", "ConfigSource", "MeshChangeHandler", "MeshConfigSource"]


class ConfigSource(Protocol):
    """A source of merged mesh config, kept current in the background.

    Contract:
    - `start()` returns once the first complete config is loaded (files read, or every
      Kubernetes resource listed) and `current` holds it; it raises ConfigError for a config
      the control plane must not start on. Handlers are not called for that first config:
      a consumer takes it from `current` once, after `start()`.
    - Afterwards, every config that differs from the previous one is handed to each handler
      given to `subscribe` (and to the constructor's `on_change`), in order; an async
      handler is awaited before the next config is handed over, and a failing handler is
      logged, never raised into the source. `current` already holds that config when the
      handler runs.
    - `errors` holds the current error of each failing input (file, or Kubernetes object);
      its last good version stays in `current`.
    - `snapshot_at`: time.monotonic() at which the scan that `current` reflects began
      (every input written before it is in `current`), or None when the source cannot say
      (Kubernetes: watch events carry no such time).
    - `close()` stops background work; it is safe to call when `start()` failed or never ran.
    """

    @property
    def current(self) -> MeshConfig: ...

    @property
    def errors(self) -> Mapping[str, ConfigError]: ...

    @property
    def snapshot_at(self) -> float | None: ...

    @property
    def reloads(self) -> int:
        """How many times `current` changed after `start()`."""
        ...

    @property
    def kube_client(self) -> KubeClient | None:
        """The Kubernetes API client the source reads through (the token reviewer and the
        webhook's CA-bundle patcher use the same one), or None outside Kubernetes."""
        ...

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """A namespace's labels as last seen (sidecar injection asks them), or None when the
        source has no such namespace or no namespaces at all (files)."""
        ...

    def status(self) -> Mapping[str, object]:
        """A JSON-friendly summary of the source's own state, for /debug/configz."""
        ...

    def subscribe(self, handler: ChangeHandler) -> None:
        """Hand every later config to `handler` too (see the class contract)."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


MeshChangeHandler = Callable[[MeshSettings], None]


class MeshConfigSource(Protocol):
    """The mesh config in effect (Istio's MeshConfig: `--mesh-config`, the ConfigMap `istio`,
    flags on top), kept current in the background; the push pipeline's second input.

    Contract: as ConfigSource, with `MeshSettings` for MeshConfig: `start()` returns once the
    first version is loaded (raising ConfigError for a file the control plane must not start
    on); later versions that differ are handed to every `subscribe`d handler (plain
    callables, on the event loop, which must return at once); `errors` holds the current
    error of each failing input while its last good version stays in `current`."""

    @property
    def current(self) -> MeshSettings: ...

    @property
    def errors(self) -> Mapping[str, ConfigError]: ...

    def status(self) -> Mapping[str, object]: ...

    def subscribe(self, handler: MeshChangeHandler) -> None: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...
