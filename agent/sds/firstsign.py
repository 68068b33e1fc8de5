"""One signing attempt: a fresh key and CSR (from a `KeyWork`), signed by a
`CertificateSigner`, and the answer checked.

A module of its own so that the agent's first attempt can start before the secret manager
and SDS are imported (agent/launch.py, `Launch.start_signing`): signing needs the key work
and the CA's protos only, a part of what the rest of agent/sds imports, and its round trip
then runs while the rest is imported. The `SecretManager` takes that attempt as its first.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agent.sds.keyspec import KeyType
from agent.sds.keywork import KeyWork
from agent.sds.signer import CertificateSigner

if TYPE_CHECKING:
    from agent.sds.workloadcert import WorkloadCert


async def sign_new_key(
    signer: CertificateSigner,
    keys: KeyWork,
    identity: str,
    key_type: KeyType,
    ttl: float,
    root_file: Path | None = None,
) -> WorkloadCert:
    """A new key (from `keys`, off the event loop) and its CSR for `identity`, signed for
    about `ttl` seconds, and the CA's answer checked against the key (and `root_file`, when
    given) by `keys` as soon as it arrives: for the agent's first certificate that check runs
    in the key worker while the secret manager is still being imported."""
    kc = await keys.new_key(identity, key_type)
    chain = await signer.sign(kc.csr_pem, max(1, round(ttl)))
    return await keys.check(chain, kc.key_pem, root_file)
