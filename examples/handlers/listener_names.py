"""An example ResponseHandler plug-in: the agent subscribes to a type on its own stream and
hands every response to this code instead of forwarding it to Envoy.

Install a package that declares the entry point (see pyproject.toml next to this file):

    [project.entry-points."pilotfish.agent.handlers"]
    listener-names = "listener_names:setup"

and the agent calls `setup(registry)` at start. The handler below keeps the names of the
listeners the control plane computes for this pod and rejects (NACKs) a response that has
none, which shows up as ERROR in the control plane's /debug/syncz.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from google.protobuf.message import Message

from agent.xdsproxy.handlers import HandlerRegistry

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
logger = logging.getLogger(__name__)

latest: list[str] = []


def on_listeners(resources: Sequence[Message]) -> None:
    names = sorted(getattr(r, "name", "") for r in resources)
    if not names:
        raise ValueError("no listeners for this pod")  # becomes the NACK's error_detail
    latest[:] = names
    logger.info("listeners for this pod: %s", ", ".join(names))


def setup(registry: HandlerRegistry) -> None:
    registry.register(LISTENER, on_listeners)
