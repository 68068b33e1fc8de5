"""Where workload keys are made and the CA's answers checked: the two steps of a certificate
that need cryptography.

`KeyWork` is what the secret manager asks for them. `ThreadKeyWork` does both in a thread of
the agent's process, loading cryptography the first time. `KeyWorker` (agent/sds/keyworker.py)
does them for the first certificate in a process forked when the agent starts
(agent/sds/workerproc.py): cryptography is then loaded on the other core while this process
loads gRPC and the protos, and not at all in this process until a later key (a rotation,
hours later) or a file-mounted secret needs it. The worker's wire: agent/sds/keywire.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from agent.sds.keyspec import KeyAndCsr, KeyType
from agent.sds.keywire import check, new_key
from agent.sds.workloadcert import WorkloadCert


class KeyWork(Protocol):
    """Makes keys and checks the CA's answers. Errors: ValueError for an identity that is no
    SPIFFE URI; SigningError when the CA's answer is unusable (agent/sds/certcheck.py)."""

    async def new_key(self, identity: str, key_type: KeyType) -> KeyAndCsr:
        """A fresh key and its CSR for `identity`."""
        ...

    async def check(self, chain: list[str], key_pem: bytes, root_file: Path | None) -> WorkloadCert:
        """The CA's `chain` for the key `key_pem`, checked and split into what is served."""
        ...

    async def close(self) -> None: ...


class ThreadKeyWork:
    """Both steps in a thread of this process (cryptography is imported there, the first
    time)."""

    async def new_key(self, identity: str, key_type: KeyType) -> KeyAndCsr:
        return await asyncio.to_thread(new_key, identity, key_type)

    async def check(self, chain: list[str], key_pem: bytes, root_file: Path | None) -> WorkloadCert:
        return await asyncio.to_thread(check, chain, key_pem, root_file)

    async def close(self) -> None:
        return None
