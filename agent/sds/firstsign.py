"""One signing attempt: a fresh key and CSR (from a `KeyWork`), signed by a
`CertificateSigner`.

A module of its own so that the agent's first attempt can start before the secret manager
and SDS are imported (agent/launch.py, `Launch.start_signing`): signing needs the key work
and the CA's protos only, a part of what the rest of agent/sds imports, and its round trip
then runs while the rest is imported. The `SecretManager` takes that attempt as its first.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.sds.keyspec import KeyAndCsr, KeyType
from agent.sds.keywork import KeyWork
from agent.sds.signer import CertificateSigner


@dataclass(frozen=True, slots=True, eq=False)
class Signed:
    """A key and the chain the CA signed for it."""

    key: KeyAndCsr
    chain: list[str]  # PEM, leaf first, root last


async def sign_new_key(
    signer: CertificateSigner, keys: KeyWork, identity: str, key_type: KeyType, ttl: float
) -> Signed:
    """A new key (from `keys`, off the event loop) and its CSR for `identity`, signed for
    about `ttl` seconds."""
    kc = await keys.new_key(identity, key_type)
    return Signed(kc, await signer.sign(kc.csr_pem, max(1, round(ttl))))
