"""Keeps the MutatingWebhookConfiguration's `caBundle` equal to our CA root.

The API server trusts the webhook's serving certificate only through the `caBundle` of each
webhook in the configuration, and our root is made at runtime (or mounted from a Secret), so a
controller puts it there: GET the object, set every webhook's `clientConfig.caBundle`, PUT it
back with the resourceVersion we read (an optimistic-concurrency update).

Several replicas run this at once with the same root. When two race, the API server accepts one
PUT and answers the other 409 Conflict; the loser reads again, finds the bundle already right and
stops: they converge instead of fighting. Conflicts are retried quickly a few times (a race
resolves in one round) and then slowly (someone keeps changing the object: back off rather than
hammer the API server). NotFound is never retried: the configuration is not installed, and the
next periodic check (`resync`) looks again; a bundle someone resets is also put back then.

`desired` and `ConflictRetry` are sans-IO; `CaBundlePatcher` is the asyncio adapter.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import enum
import logging
from collections.abc import Mapping
from typing import Any

from control.kube.client import ApiError, KubeClient
from control.kube.retry import ConflictRetry
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

logger = logging.getLogger(__name__)

PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
DEFAULT_NAME = "pilotfish-sidecar-injector"


def default_name(revision: str = "") -> str:
    """The webhook configuration a control plane keeps, as Istio names a revision's
    (istio-sidecar-injector-<rev>)."""
    return f"{DEFAULT_NAME}-{revision}" if revision else DEFAULT_NAME


class Outcome(enum.Enum):
    UP_TO_DATE = "up-to-date"
    UPDATED = "updated"
    NOT_FOUND = "not-found"
    FAILED = "failed"  # gave up this round (errors other than conflicts); resync tries again


def ca_bundle(root_pem: str) -> str:
    """`caBundle` is the PEM bundle, base64-encoded (a []byte field in JSON)."""
    return base64.b64encode(root_pem.encode()).decode()


def desired(config: Mapping[str, Any], bundle: str) -> dict[str, Any] | None:
    """The configuration with every webhook's caBundle set to `bundle`, keeping its
    resourceVersion (so the PUT is conditional); None when nothing needs to change."""
    webhooks = config.get("webhooks") or []
    if all((w.get("clientConfig") or {}).get("caBundle") == bundle for w in webhooks):
        return None
    out = copy.deepcopy(dict(config))
    for w in out.get("webhooks") or []:
        w.setdefault("clientConfig", {})["caBundle"] = bundle
    return out


class CaBundlePatcher(Lifecycle):
    """`async with CaBundlePatcher(client, root_pem)`: syncs at start, then every `resync`."""

    def __init__(
        self,
        client: KubeClient,
        root_pem: str,
        name: str = DEFAULT_NAME,
        *,
        resync: float = 30.0,
        retry: ConflictRetry | None = None,
        max_attempts: int = 12,
    ) -> None:
        self.client = client
        self.bundle = ca_bundle(root_pem)
        self.name = name
        self.resync = resync
        self.retry = retry or ConflictRetry()
        self.max_attempts = max_attempts
        self.updates = 0
        self.conflicts = 0
        self.last: Outcome | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def path(self) -> str:
        return f"{PATH}/{self.name}"

    async def sync(self) -> Outcome:
        """Read, and update when needed, until the bundle is ours (or NotFound / give up)."""
        self.retry.reset()
        for _ in range(self.max_attempts):
            try:
                current = await self.client.get(self.path)
                update = desired(current, self.bundle)
                if update is None:
                    return self._done(Outcome.UP_TO_DATE)
                await self.client.replace(self.path, update)
                self.updates += 1
                logger.info("webhook configuration %s: caBundle set to our root", self.name)
                return self._done(Outcome.UPDATED)
            except ApiError as e:
                if e.status == 404:
                    logger.info("webhook configuration %s not found; not patching", self.name)
                    return self._done(Outcome.NOT_FOUND)
                if e.status != 409:
                    logger.warning("webhook configuration %s: %s", self.name, e)
                    return self._done(Outcome.FAILED)
                self.conflicts += 1
                delay = self.retry.next_delay()
                logger.debug("webhook configuration %s: conflict; again in %.2fs", self.name, delay)
                await asyncio.sleep(delay)
            except (OSError, TimeoutError, ValueError) as e:
                logger.warning("webhook configuration %s: %s", self.name, str(e) or repr(e))
                return self._done(Outcome.FAILED)
        logger.warning("webhook configuration %s: still conflicting; next try later", self.name)
        return self._done(Outcome.FAILED)

    def _done(self, outcome: Outcome) -> Outcome:
        self.last = outcome
        return outcome

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="webhook-ca-bundle")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:  # aiohttp.ClientError and friends: try again at the next resync
                logger.exception("webhook configuration %s: sync failed", self.name)
            await asyncio.sleep(self.resync)
