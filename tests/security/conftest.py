"""Fixtures of the attacker's suite: a real control plane to attack."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control.app import ControlPlane
from tests.security.common import MESH
from tests.support.controlplane import running_control_plane


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "mesh.yaml").write_text(MESH)
    return d


@pytest.fixture
async def cp(cfg: Path, tmp_path: Path) -> AsyncIterator[ControlPlane]:
    """Plaintext, TLS and mTLS ports; CA root and token key in a state dir."""
    async with running_control_plane(cfg, mtls=True, state_dir=tmp_path / "state") as cp:
        yield cp
