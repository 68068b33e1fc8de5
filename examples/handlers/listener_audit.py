"""An example ResponseHandler plug-in: audits the listeners the control plane computes for
this pod.

Install it next to the agent (`pip install ./examples/handlers`); its pyproject.toml declares
the entry point the agent loads at start:

    [project.entry-points."pilotfish.agent.handlers"]
    listener-audit = "listener_audit:setup"

Environment (read once, by `setup`):

- `LISTENER_AUDIT_MODE`: `observe` (default) sees every Listener response the agent relays to
  Envoy, after Envoy has it: a failed check is logged and counted on the agent's
  /stats/prometheus (`pilotfish_agent_handler_observe_errors_total`), never a NACK.
  `consume` takes Listener responses away from Envoy: the agent ACKs them, or NACKs a failed
  check, which shows as ERROR in the control plane's /debug/syncz.
- `LISTENER_AUDIT_REQUIRE`: comma-separated listener names a response must contain (default:
  at least one listener).
- `LISTENER_AUDIT_FILE`: append one JSON line per response (`{"mode", "listeners"}`), a
  mirror of what the pod was sent.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from envoy.config.listener.v3.listener_pb2 import Listener

from agent.xdsproxy.handlers import HandlerRegistry, Mode

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
logger = logging.getLogger(__name__)


@dataclass
class ListenerAudit:
    mode: Mode = "observe"
    require: frozenset[str] = frozenset()
    mirror: Path | None = None

    def __post_init__(self) -> None:
        self.latest: list[str] = []

    def __call__(self, resources: Sequence[Listener]) -> None:
        names = sorted(r.name for r in resources)
        self.latest = names
        if self.mirror is not None:
            # Small appends; a handler may block briefly (observers run off the relay's path).
            with self.mirror.open("a") as f:
                f.write(json.dumps({"mode": self.mode, "listeners": names}) + "\n")
        missing = sorted(self.require - set(names))
        if missing:
            raise ValueError(f"missing listeners: {', '.join(missing)}")  # the NACK's text
        if not names:
            raise ValueError("no listeners for this pod")
        logger.info("listeners for this pod: %s", ", ".join(names))


def from_environment(env: Mapping[str, str] = os.environ) -> ListenerAudit:
    mode = env.get("LISTENER_AUDIT_MODE", "observe")
    if mode not in ("observe", "consume"):
        raise ValueError(f"LISTENER_AUDIT_MODE must be observe or consume, not {mode!r}")
    require = frozenset(n for n in env.get("LISTENER_AUDIT_REQUIRE", "").split(",") if n)
    mirror = env.get("LISTENER_AUDIT_FILE")
    return ListenerAudit(
        "consume" if mode == "consume" else "observe", require, Path(mirror) if mirror else None
    )


def setup(registry: HandlerRegistry) -> None:
    audit = from_environment()
    registry.register(LISTENER, audit, mode=audit.mode, message_class=Listener)
