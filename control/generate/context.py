"""What every generator receives: the push's index, the shared cache and a per-push memo."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from google.protobuf.message import Message

from control.model.index import MeshIndex
from control.xds.cache import Resource, ResourceCache

T = TypeVar("T")


class GenContext:
    """One push's generation state.

    `resource()` goes through the long-lived cache (serialize once per input version, rule 8);
    `memo()` shares work between proxies within this push (e.g. the outbound clusters of every
    proxy that sees the same services are computed once).
    """

    def __init__(self, index: MeshIndex, cache: ResourceCache) -> None:
        self.index = index
        self.cache = cache
        self._memo: dict[Hashable, object] = {}

    def resource(
        self,
        type_url: str,
        name: str,
        key: Hashable,
        build: Callable[[], Message],
        variant: Hashable = None,
    ) -> Resource:
        return self.cache.get(type_url, name, key, build, variant)

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        if key in self._memo:
            return self._memo[key]  # type: ignore[return-value]
        value = compute()
        self._memo[key] = value
        return value
