"""The key worker's wire (agent/sds/keyworker.py, agent/sds/workerproc.py), sans-IO:
length-prefixed JSON frames, a request builder per step, the worker's answer, and the reading
of the answers into what the in-process steps return or raise. Both ends are tested without a
process. The two steps themselves (`new_key`, `check`) import cryptography when first called.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.sds.keyspec import KeyAndCsr, KeyType
from agent.sds.signer import SigningError
from agent.sds.workloadcert import WorkloadCert
from pilotfish_common.jsonobject import json_object

Message = dict[str, Any]

# A chain of a few certificates is a few KB; anything near this is not the worker talking.
MAX_FRAME = 1 << 20
_HEADER = 4


def new_key(identity: str, key_type: KeyType) -> KeyAndCsr:
    """A fresh key and CSR (blocking; cryptography)."""
    from agent.sds.keys import generate_key_and_csr

    return generate_key_and_csr(identity, key_type)


def check(chain: list[str], key_pem: bytes, root_file: Path | None) -> WorkloadCert:
    """The CA's answer checked (blocking; cryptography)."""
    from agent.sds.certcheck import checked_cert

    return checked_cert(chain, key_pem, root_file)


class FrameError(Exception):
    """The other end sent something that is not a frame of this wire."""


def encode(message: Message) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return len(body).to_bytes(_HEADER, "big") + body


class Frames:
    """Bytes in, whole messages out."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= _HEADER:
            size = int.from_bytes(self._buf[:_HEADER], "big")
            if size > MAX_FRAME:
                raise FrameError(f"frame of {size} bytes")
            if len(self._buf) < _HEADER + size:
                break
            body = bytes(self._buf[_HEADER : _HEADER + size])
            del self._buf[: _HEADER + size]
            try:
                out.append(json_object(body))
            except ValueError as e:
                raise FrameError(str(e)) from None
        return out


def key_request(identity: str, key_type: KeyType) -> Message:
    return {"op": "key", "identity": identity, "key_type": key_type.value}


def check_request(chain: list[str], key_pem: bytes, root_file: Path | None) -> Message:
    return {
        "op": "check",
        "chain": chain,
        "key_pem": key_pem.decode("ascii"),
        "root_file": None if root_file is None else str(root_file),
    }


def answer(request: Message) -> Message:
    """The worker's side: a request's answer, its errors included (blocking; cryptography)."""
    try:
        if request.get("op") == "key":
            kc = new_key(str(request["identity"]), KeyType(request["key_type"]))
            return {"key_pem": kc.key_pem.decode("ascii"), "csr_pem": kc.csr_pem.decode("ascii")}
        if request.get("op") == "check":
            root = request["root_file"]
            cert = check(
                list(request["chain"]),
                str(request["key_pem"]).encode("ascii"),
                None if root is None else Path(root),
            )
            return {
                "chain_pem": cert.chain_pem.decode("ascii"),
                "key_pem": cert.key_pem.decode("ascii"),
                "root_pem": cert.root_pem.decode("ascii"),
                "serial": cert.serial,
                "not_before": cert.not_before,
                "not_after": cert.not_after,
                "identity": cert.identity,
            }
        return {"error": f"unknown request {request.get('op')!r}", "kind": "value"}
    except SigningError as e:
        return {"error": str(e), "kind": "signing", "retryable": e.retryable}
    except (ValueError, KeyError, TypeError) as e:
        return {"error": str(e), "kind": "value"}


def _raise_error(reply: Message) -> None:
    if "error" not in reply:
        return
    message = str(reply["error"])
    if reply.get("kind") == "signing":
        raise SigningError(message, retryable=bool(reply.get("retryable", True)))
    raise ValueError(message)


def key_from_reply(reply: Message) -> KeyAndCsr:
    """The key in the worker's answer; its error raised as the in-process step would."""
    _raise_error(reply)
    try:
        return KeyAndCsr(
            key_pem=str(reply["key_pem"]).encode("ascii"),
            csr_pem=str(reply["csr_pem"]).encode("ascii"),
        )
    except (KeyError, UnicodeEncodeError) as e:
        raise FrameError(f"not a key answer: {e}") from None


def cert_from_reply(reply: Message) -> WorkloadCert:
    """The checked certificate in the worker's answer; its error raised as the in-process
    step would."""
    _raise_error(reply)
    try:
        identity = reply["identity"]
        return WorkloadCert(
            chain_pem=str(reply["chain_pem"]).encode("ascii"),
            key_pem=str(reply["key_pem"]).encode("ascii"),
            root_pem=str(reply["root_pem"]).encode("ascii"),
            serial=int(reply["serial"]),
            not_before=float(reply["not_before"]),
            not_after=float(reply["not_after"]),
            identity=None if identity is None else str(identity),
        )
    except (KeyError, ValueError, TypeError, UnicodeEncodeError) as e:
        raise FrameError(f"not a certificate answer: {e}") from None
