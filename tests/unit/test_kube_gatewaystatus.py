"""The status writer's decisions: what it sends where, that a write the watch has not shown
yet is not sent again, that a failed write is retried and a gone object skipped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from control.kube.client import ApiError, KubeClient, KubeConfig
from control.kube.gatewaystatus import StatusWriter
from control.kube.reflector import Key
from tests.support.gatewayapi import gateway, gateway_class, load, route, service, status_of

NOW = "2026-01-01T00:00:00Z"


class _Client(KubeClient):
    def __init__(self) -> None:
        super().__init__(KubeConfig("http://unused"))
        self.sent: list[tuple[str, Any]] = []
        self.errors: list[ApiError] = []

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> Any:
        if self.errors:
            raise self.errors.pop(0)
        self.sent.append((path, body))
        return body


def _writer() -> tuple[StatusWriter, _Client, dict[Key, dict[str, Any]]]:
    client = _Client()
    store: dict[Key, dict[str, Any]] = {
        ("infra", "r"): {"metadata": {"name": "r", "namespace": "infra", "resourceVersion": "5"}}
    }
    paths = {"HTTPRoute": ("/apis/gateway.networking.k8s.io/v1", "httproutes")}
    writer = StatusWriter(client, paths, lambda kind: store, now=lambda: NOW)
    mesh = load(gateway_class(), service("v1"), gateway(), route("r"))
    writer.update((status_of(mesh, "HTTPRoute", "infra", "r"),))
    return writer, client, store


async def test_writes_once_until_the_watch_shows_it() -> None:
    writer, client, store = _writer()
    assert await writer.write_pending()
    ((path, body),) = client.sent
    assert path == "/apis/gateway.networking.k8s.io/v1/namespaces/infra/httproutes/r/status"
    assert body["status"]["parents"][0]["conditions"][0]["reason"] == "Accepted"
    # The watch has not delivered our write yet: not sent again.
    assert await writer.write_pending()
    assert len(client.sent) == 1
    # The watch shows it: nothing to write.
    store[("infra", "r")] = {
        "metadata": {"name": "r", "namespace": "infra", "resourceVersion": "6"},
        "status": body["status"],
    }
    assert await writer.write_pending()
    assert len(client.sent) == 1 and writer.writes == 1


async def test_a_failed_write_is_retried_and_a_gone_object_skipped() -> None:
    writer, client, store = _writer()
    client.errors.append(ApiError(500, "etcd is sad"))
    assert not await writer.write_pending()
    assert writer.failures == 1 and client.sent == []
    assert await writer.write_pending()
    assert len(client.sent) == 1
    # Deleted meanwhile (404): skipped, not a failure.
    store[("infra", "r")]["metadata"]["resourceVersion"] = "7"
    store[("infra", "r")]["status"] = {"parents": []}
    client.errors.append(ApiError(404, "gone"))
    assert await writer.write_pending()
    assert writer.failures == 1
    # Not in the store at all: nothing is sent.
    store.clear()
    assert await writer.write_pending()
    assert len(client.sent) == 1
