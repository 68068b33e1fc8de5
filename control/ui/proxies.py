"""The proxies view (sans-IO): syncz folded into one row per proxy and replica, as
`pilotfish-ctl proxy-status` shows it (control/ctl/status.py's `proxy_rows`), with every NACK
message and the link to the proxy's config dump.

The local replica's syncz is read in-process; other replicas' rows (Kubernetes mode: the
control-plane pods, asked over xDS as proxy-status asks them) are merged in by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from control.ctl.status import COLUMNS, ProxyRow, StreamStatus, proxy_rows


def local_streams(syncz: Iterable[Mapping[str, Any]]) -> list[StreamStatus]:
    """/debug/syncz entries as the StreamStatus rows proxy-status decodes from xDS."""
    out = []
    for entry in syncz:
        types = {
            str(t): (
                str(row.get("status", "")),
                str(row.get("sent_version", "")),
                str(row.get("last_nack", "")),
            )
            for t, row in (entry.get("types") or {}).items()
        }
        out.append(
            StreamStatus(
                str(entry.get("proxy", "")),
                str(entry.get("istiod", "")),
                str(entry.get("stream", "")),
                types,
            )
        )
    return out


def namespace_of(row: ProxyRow) -> str:
    """The namespace in a node id's `pod.namespace` part ("" when it has none)."""
    _, _, namespace = row.name.partition(".")
    return namespace


def proxies_json(
    rows: Sequence[ProxyRow],
    namespaces: frozenset[str] | None = None,
    replica_errors: Sequence[str] = (),
) -> dict[str, object]:
    shown = [r for r in rows if not namespaces or namespace_of(r) in namespaces]
    out = []
    for r in shown:
        row = r.as_json()
        row["namespace"] = namespace_of(r)
        # Worst first: ERROR (a NACK), then STALE, NOT_SENT, SYNCED.
        states = set(r.states.values())
        row["status"] = next(
            (s for s in ("ERROR", "STALE", "NOT_SENT", "SYNCED") if s in states), "UNKNOWN"
        )
        row["nacks"] = [
            {"type": short, "message": r.errors[short]} for short, _ in COLUMNS if short in r.errors
        ]
        row["config_dump"] = f"/debug/config_dump?proxyID={quote(r.proxy, safe='')}"
        out.append(row)
    return {
        "columns": [short for short, _ in COLUMNS],
        "namespaces": sorted({namespace_of(r) for r in rows if namespace_of(r)}),
        "proxies": out,
        "replica_errors": list(replica_errors),
    }


def merge_rows(local: Iterable[StreamStatus], remote: Iterable[ProxyRow]) -> list[ProxyRow]:
    """Local streams as rows, plus the rows other replicas gave (the same proxy connected to
    two replicas is two rows, as in proxy-status)."""
    rows = proxy_rows(local)
    have = {(r.proxy, r.replica) for r in rows}
    rows.extend(r for r in remote if (r.proxy, r.replica) not in have)
    return sorted(rows, key=lambda r: (r.name, r.proxy, r.replica))
