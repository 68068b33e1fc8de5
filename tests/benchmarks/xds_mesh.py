"""A generated mesh as config files, and endpoint churn by rewriting them.

S services (`svc-<s>`, namespace default, HTTP port 9080) with E WorkloadEntries each. The
Services are in one file; the WorkloadEntries in files of `group` services each, so a change
rewrites one small file (what an operator or a controller does) and the control plane's
watcher re-reads only that file. Files are replaced atomically (write, then rename).

Change j (j = 1, 2, …) moves endpoint 0 of service (j - 1) % S to `marker_address(j)`: the
simulated proxies (xds_sim.py) see from the endpoints they receive which changes they have.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.benchmarks.xds_sim import marker_address


class MeshFiles:
    def __init__(self, root: Path, services: int, endpoints: int, group: int = 10) -> None:
        if services < 1 or endpoints < 1 or group < 1:
            raise ValueError("services, endpoints and group must be at least 1")
        self.root = root
        self.services = services
        self.endpoints = endpoints
        self.group = group
        self.changes = 0
        # Overrides of endpoint 0's address per service (by the churn).
        self._moved: dict[int, str] = {}

    def write(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        docs = [
            f"apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: default}}\n"
            f"spec:\n  selector: {{app: svc-{s}}}\n"
            f"  ports: [{{name: http, port: 9080, targetPort: 8080}}]\n"
            for s in range(self.services)
        ]
        _replace(self.root / "services.yaml", "---\n".join(docs))
        for g in range(0, self.services, self.group):
            self._write_group(g // self.group)

    def address(self, s: int, e: int) -> str:
        if e == 0 and s in self._moved:
            return self._moved[s]
        return f"10.{s // 250}.{s % 250}.{10 + e}"

    def _write_group(self, g: int) -> None:
        docs = []
        for s in range(g * self.group, min(self.services, (g + 1) * self.group)):
            for e in range(self.endpoints):
                docs.append(
                    "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n"
                    f"metadata: {{name: svc-{s}-{e}, namespace: default}}\n"
                    f'spec: {{address: "{self.address(s, e)}", labels: {{app: svc-{s}}}}}\n'
                )
        _replace(self.root / f"endpoints-{g:04d}.yaml", "---\n".join(docs))

    def change(self) -> int:
        """Apply the next change; returns its number (the marker the proxies will see)."""
        self.changes += 1
        j = self.changes
        s = (j - 1) % self.services
        self._moved[s] = marker_address(j)
        self._write_group(s // self.group)
        return j


def _replace(path: Path, text: str) -> None:
    # A hidden temporary name: the watcher skips dot files, so it never reads a half file.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
