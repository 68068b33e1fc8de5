"""Envoy configuration generators, one module per xDS type.

`GENERATORS` maps a type URL to the function that computes that type's resources for a proxy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from control.generate import clusters, endpoints, listeners, routes
from control.generate.common import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.generate.context import GenContext
from control.model.proxy import Proxy
from control.xds.cache import ResourceSet

Generator = Callable[[GenContext, Proxy], ResourceSet]

GENERATORS: Final[dict[str, Generator]] = {
    CLUSTER_TYPE: clusters.generate,
    ENDPOINT_TYPE: endpoints.generate,
    LISTENER_TYPE: listeners.generate,
    ROUTE_TYPE: routes.generate,
}

__all__ = ["GENERATORS", "Generator"]
