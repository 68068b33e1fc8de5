"""The asyncio side of one list+watch: list, then watch from the list's resourceVersion, relist
on 410, back off on errors, forever (until cancelled). The sans-IO `Reflector` keeps the
store; the caller learns of changes through two callbacks. Shared by the config source
(control/kube/source.py) and the root-certificate publisher (control/kube/rootcert.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from control.kube.client import ApiError, KubeClient
from control.kube.reflector import Backoff, Next, Reflector

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WatchSpec:
    path: str  # e.g. /api/v1/namespaces
    field_selector: str = ""
    page_size: int = 500
    watch_timeout: int = 300  # seconds the API server keeps one watch open
    # Seconds to wait before listing again when the API server does not serve `path` (404:
    # a CRD that is not installed), treating it as empty meanwhile; None: a 404 is an error.
    missing_retry: float | None = None


async def reflect(
    client: KubeClient,
    reflector: Reflector,
    spec: WatchSpec,
    *,
    on_listed: Callable[[], None],
    on_event: Callable[[], None],
) -> None:
    """Keep `reflector` in sync with `spec.path`. `on_listed` runs after every (re)list,
    `on_event` after every watch event; both must return at once."""
    backoff = Backoff()
    must_list = True
    path = spec.path
    while True:
        try:
            if must_list:
                try:
                    items, rv = await client.list_all(
                        path, spec.page_size, field_selector=spec.field_selector
                    )
                except ApiError as e:
                    if e.status != 404 or spec.missing_retry is None:
                        raise
                    logger.info("%s: not served by the API server (%s)", path, e)
                    reflector.listed([], "")
                    on_listed()
                    await asyncio.sleep(spec.missing_retry)
                    continue
                reflector.listed(items, rv)
                must_list = False
                on_listed()
            async for event in client.watch(
                path,
                reflector.resource_version,
                spec.watch_timeout,
                field_selector=spec.field_selector,
            ):
                if reflector.event(event) is Next.RELIST:
                    logger.info("%s: watch expired (410); listing again", path)
                    must_list = True
                    break
                on_event()
            backoff.reset()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # ApiError, WatchError, OSError, aiohttp.ClientError, ...
            if isinstance(e, ApiError) and e.status == 410:
                must_list = True
            delay = backoff.next_delay()
            logger.warning("%s: %s; retrying in %.1fs", path, str(e) or repr(e), delay)
            await asyncio.sleep(delay)
