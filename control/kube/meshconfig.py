"""Kubernetes mode: the mesh config from the ConfigMap `istio` (key `mesh`) in the control
plane's namespace, as istiod reads it. One list+watch of that one ConfigMap; a bad `mesh`
value is logged once (`ConfigMap <ns>/istio data.mesh:<line>: reason`) and the last good
version stays in use; a deleted ConfigMap means "no mesh config here" (the file, if any, or
Istio's defaults apply). A `MeshInput` of control/config/meshwatch.py."""

from __future__ import annotations

import asyncio
import logging

from control.config.errors import ConfigError
from control.config.meshconfig import parse_mesh_config
from control.config.meshwatch import MeshInputBase
from control.kube.client import KubeClient
from control.kube.reflector import Reflector
from control.kube.watchloop import WatchSpec, reflect

logger = logging.getLogger(__name__)

CONFIGMAP = "istio"
KEY = "mesh"


class KubeMeshConfig(MeshInputBase):
    def __init__(self, client: KubeClient, namespace: str, *, watch_timeout: int = 300) -> None:
        super().__init__(f"ConfigMap {namespace}/{CONFIGMAP} data.{KEY}")
        self.namespace = namespace
        self._client = client
        self._reflector = Reflector()
        self._spec = WatchSpec(
            f"/api/v1/namespaces/{namespace}/configmaps",
            f"metadata.name={CONFIGMAP}",
            watch_timeout=watch_timeout,
        )
        self._text: str | None = None
        self._listed = asyncio.Event()

    async def start(self) -> None:
        """Start the watch and wait for its first list (the ConfigMap may not exist)."""

        def listed() -> None:
            self._update()
            self._listed.set()

        self._task = asyncio.create_task(
            reflect(
                self._client, self._reflector, self._spec, on_listed=listed, on_event=self._update
            ),
            name="kube-mesh-config",
        )
        await self._listed.wait()

    def _update(self) -> None:
        obj = self._reflector.store.get((self.namespace, CONFIGMAP))
        text = None if obj is None else (obj.get("data") or {}).get(KEY)
        if text is not None and not isinstance(text, str):
            text = None
        if text == self._text and self._listed.is_set():
            return
        self._text = text
        if text is None:
            self._current, self._error = None, None
        else:
            try:
                self._current = parse_mesh_config(text, self.name)
                if self._error is not None:
                    logger.info("%s is valid again", self.name)
                self._error = None
            except ConfigError as e:
                if e != self._error:
                    logger.error("%s (keeping the last good mesh config)", e)
                self._error = e
        self.on_change()
