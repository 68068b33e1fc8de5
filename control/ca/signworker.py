"""The CA's signing worker: `python -m control.ca.signworker`, started by the control plane
(control/ca/signer.py), never by hand.

Why a process: signing a certificate is ~0.2 ms of CPU in `cryptography`, which holds the GIL
while it works, and the gRPC side of the same call costs about as much again in Python. On a
thread they take turns on one core; in a process of its own the signing runs on another core
while the control plane's event loop serves gRPC.

It reads the CA material (the first frame on stdin; the key never appears on a command line
or in the environment), then signs batches until stdin closes. It ignores SIGINT and SIGTERM:
its lifetime is its parent's, which closes stdin when it shuts down (or dies), so a signal
sent to the whole process group does not take the CA away before the control plane has
finished its clean shutdown.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
from typing import BinaryIO

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from control.ca.authority import CaLimits, CertificateAuthority, CsrError
from control.ca.identity import Identity
from control.ca.signwire import (
    HEADER_SIZE,
    CaMaterial,
    Outcome,
    SignJob,
    SignOutcome,
    WireError,
    frame_length,
    parse,
    parse_init,
    parse_jobs,
    signed_frame,
)


def authority_from(material: CaMaterial) -> CertificateAuthority:
    certs = [x509.load_pem_x509_certificate(p.encode()) for p in material.cert_pems]
    key = serialization.load_pem_private_key(material.key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise WireError(f"{type(key).__name__} is not a CA key")
    return CertificateAuthority(
        certs[0],
        key,
        certs[1:],
        material.trust_domain,
        CaLimits(max_workload_ttl=material.max_workload_ttl),
    )


def sign_one(ca: CertificateAuthority, job: SignJob) -> SignOutcome:
    """The leaf's PEM, or why not; never raises for one bad job."""
    try:
        identity = Identity(job.namespace, job.service_account)
        chain = ca.sign_csr(
            job.csr_pem, identity, job.ttl, dt.datetime.fromtimestamp(job.now, dt.UTC)
        )
    except CsrError as e:
        return SignOutcome(job.id, Outcome.BAD_CSR, str(e))
    except Exception as e:  # reported to the parent, which logs it and answers INTERNAL
        return SignOutcome(job.id, Outcome.FAILED, f"{type(e).__name__}: {e}")
    return SignOutcome(job.id, Outcome.SIGNED, chain[0])


def _read_frame(src: BinaryIO) -> bytes | None:
    header = src.read(HEADER_SIZE)
    if not header:
        return None  # the parent closed stdin: done
    if len(header) < HEADER_SIZE:
        raise WireError("stream ended inside a frame header")
    n = frame_length(header)
    payload = src.read(n)
    if len(payload) < n:
        raise WireError("stream ended inside a frame")
    return payload


def serve(src: BinaryIO, dst: BinaryIO) -> None:
    first = _read_frame(src)
    if first is None:
        return
    ca = authority_from(parse_init(parse(first)))
    while (payload := _read_frame(src)) is not None:
        jobs = parse_jobs(parse(payload))
        dst.write(signed_frame([sign_one(ca, job) for job in jobs]))
        dst.flush()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The frames own fd 1; a stray print anywhere must not corrupt them, so Python's stdout
    # goes to stderr from here on.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    src = os.fdopen(0, "rb", buffering=1 << 16)
    try:
        serve(src, out)
    except WireError as e:
        print(f"pilotfish CA signing worker: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0  # the parent is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())
