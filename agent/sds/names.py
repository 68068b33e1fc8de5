"""Which secret names the control plane holds (`kubernetes://…`, fetched by remote.py with
the rules of fetch.py), without the stream's rules and protos: the secret manager asks it of
every name an SDS stream opens, and an agent that serves no gateway certificate loads
neither of those modules (issue 23)."""

from __future__ import annotations

# Istio's names for Secrets the control plane holds (credentialName / certificateRefs).
REMOTE_PREFIX = "kubernetes://"


def is_remote_name(name: str) -> bool:
    return name.startswith(REMOTE_PREFIX) and len(name) > len(REMOTE_PREFIX)
