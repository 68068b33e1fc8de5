"""The NameTable ResponseHandler: NDS responses from the agent stream become the DNS server's
lookup table. Registered with `HandlerRegistry` like any plug-in handler; raising NACKs the
response, and the previous table keeps being served."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import Message

from agent.dns.table import LookupTable, NameInfo, NameTableError
from protos import nds_pb2

logger = logging.getLogger(__name__)


class NameTableHandler:
    """Validates each NameTable, builds its `LookupTable` and hands it to `on_table`."""

    def __init__(
        self,
        on_table: Callable[[LookupTable], None],
        *,
        namespace: str,
        cluster_domain: str = "cluster.local",
        search_domains: Sequence[str] = (),
    ) -> None:
        self._on_table = on_table
        self._namespace = namespace
        self._cluster_domain = cluster_domain
        self._search_domains = tuple(search_domains)
        self._version = 0
        self.table: LookupTable | None = None
        self.received = asyncio.Event()  # set once a first table was accepted

    def __call__(self, resources: Sequence[Message]) -> None:
        rows: dict[str, NameInfo] = {}
        for msg in resources:
            if not isinstance(msg, nds_pb2.NameTable):
                raise NameTableError(f"expected a NameTable, got {type(msg).__name__}")
            for host, info in msg.table.items():
                if host in rows:
                    raise NameTableError(f"host {host!r} is in more than one resource")
                rows[host] = NameInfo(
                    tuple(info.ips), info.registry, info.shortname, info.namespace
                )
        table = LookupTable.build(
            rows,
            namespace=self._namespace,
            cluster_domain=self._cluster_domain,
            search_domains=self._search_domains,
            version=self._version + 1,
        )
        self._version = table.version
        self.table = table
        self._on_table(table)
        self.received.set()
        logger.debug("name table v%d: %d hosts", table.version, len(table))

    def ndsz(self) -> dict[str, Any]:
        """What /debug/ndsz shows."""
        if self.table is None:
            return {"version": 0, "hosts": {}, "note": "no name table received yet"}
        return self.table.as_json()
