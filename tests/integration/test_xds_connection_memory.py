"""What a connected proxy costs the control plane in Python objects, a connection each (issue
23, target 2): measured with tracemalloc in the control plane's process while simulated
proxies in worker processes (tests/benchmarks/xds_load.py) hold real gRPC streams, one
connection per proxy, as sidecars do.

Measured 2026-12-04 (delta and SotW, 100 proxies, 10 services): 9.7 KB per proxy in all
(most of it grpc.aio's objects for the call), of which 3.0 KB is traced to lines under
control/xds/: the stream's types (4 x 160 bytes), the connection, its id, the proxy, the
stream state machine, the proxy's own listener in the cache, and the pending read that
grpc.aio allocates under our `context.read()` (1.2 KB). The bounds have a third of margin:
a regression of a kilobyte of our own state per stream fails the second assertion. gRPC
core's part (malloc'd, not traced here) is in what tests/benchmarks/xds_storm.py prints as
"allocated per stream".
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from pathlib import Path

import pytest

import control.xds
from tests.benchmarks.xds_load import LoadClients, LoadOptions
from tests.benchmarks.xds_mesh import MeshFiles
from tests.support.controlplane import eventually, running_control_plane

PROXIES = 100
XDS_DIR = str(Path(control.xds.__file__).parent)
TOTAL_MAX = 13_000  # bytes per proxy, everything traced in the control plane's process
OURS_MAX = 4_000  # bytes per proxy traced to control/xds/ (the stream state)


def _growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> tuple[int, int]:
    """(bytes grown in all, bytes grown in lines of control/xds/)."""
    total = sum(d.size_diff for d in after.compare_to(before, "filename"))
    mine = [tracemalloc.Filter(True, f"{XDS_DIR}/*")]
    ours = sum(
        d.size_diff
        for d in after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename")
    )
    return total, ours


@pytest.mark.parametrize("delta", [True, False], ids=["delta", "sotw"])
async def test_a_connected_proxy_costs_a_bounded_amount_of_python_objects(
    tmp_path: Path, delta: bool
) -> None:
    mesh = MeshFiles(tmp_path / "mesh", 10, 2)
    mesh.write()
    async with running_control_plane(mesh.root, secure=False) as cp:
        target = f"127.0.0.1:{cp.xds_port}"
        # One proxy first: the config it makes the control plane generate and cache is not
        # a cost of the others.
        warm = LoadClients(LoadOptions(target, 1, workers=1, delta=delta, first_index=PROXIES))
        async with warm:
            await warm.wait_converged(60)
            await asyncio.sleep(0.5)
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.take_snapshot()
                opts = LoadOptions(target, PROXIES, workers=1, delta=delta, per_channel=1)
                async with LoadClients(opts) as load:
                    await load.wait_converged(120)
                    await eventually(
                        lambda: len(cp.xds.connections) == PROXIES + 1, what="every stream"
                    )
                    await eventually(lambda: cp.xds.send_workers == 0, what="sends done")
                    gc.collect()
                    after = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
    total, ours = _growth(before, after)
    assert total / PROXIES < TOTAL_MAX, f"{total / PROXIES:.0f} bytes per connected proxy"
    assert ours / PROXIES < OURS_MAX, f"{ours / PROXIES:.0f} bytes per proxy in control/xds/"
    # Not vacuous: each proxy's stream state is really there and was measured.
    assert ours / PROXIES > 300
