"""Service-account tokens validated by the API server (TokenReview), for Kubernetes mode.

The agent presents its pod's projected service-account token (audience `istio-ca`); we ask
`POST /apis/authentication.k8s.io/v1/tokenreviews` whether it is valid for that audience and
take the namespace and service account from the username the API server returns
(`system:serviceaccount:<ns>:<sa>`). The Authenticator caches the answer; `cache_ttl` bounds
how long, so a revoked token (deleted pod) stops working soon after.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence

from control.ca.authn import AUDIENCE, AuthError, Denial
from control.ca.identity import Identity, IdentityError
from control.kube.client import ApiError, KubeClient

logger = logging.getLogger(__name__)

PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


class KubeTokenReviewer:
    def __init__(
        self, client: KubeClient, audiences: Sequence[str] = (AUDIENCE,), cache_ttl: float = 60.0
    ) -> None:
        self.client = client
        self.audiences = tuple(audiences)
        self.cache_ttl = cache_ttl

    async def review(self, token: str, now: float) -> tuple[Identity, float]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": list(self.audiences)},
        }
        try:
            answer = await self.client.create(PATH, body)
        except (ApiError, OSError, ValueError) as e:
            logger.warning("TokenReview failed: %s", e)
            raise AuthError(Denial.UNAUTHENTICATED, f"token review failed: {e}") from None
        status = answer.get("status") or {}
        if not status.get("authenticated"):
            reason = status.get("error") or "not authenticated"
            raise AuthError(Denial.UNAUTHENTICATED, f"token review: {reason}")
        audiences = status.get("audiences") or []
        if self.audiences and not set(audiences) & set(self.audiences):
            raise AuthError(
                Denial.UNAUTHENTICATED, f"token review: audiences {audiences} lack {AUDIENCE!r}"
            )
        username = str((status.get("user") or {}).get("username") or "")
        try:
            identity = Identity.from_subject(username)
        except IdentityError as e:
            raise AuthError(Denial.UNAUTHENTICATED, f"token review: {e}") from None
        return identity, min(now + self.cache_ttl, _expiry(token, now + self.cache_ttl))


def _expiry(token: str, default: float) -> float:
    """The token's own `exp` (read, not trusted: the API server vouched for the token)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp")
        return float(exp) if isinstance(exp, int | float) else default
    except (IndexError, ValueError, AttributeError):
        return default
