"""Benchmark: certificate signing.

(a) certificates signed per second through `CreateCertificate` over gRPC (a real
    `python -m control` subprocess, concurrent clients on one channel, bearer token, ECDSA
    P-256 CA and CSR keys) vs the in-process floor: parse the CSR, check its signature, build
    and sign the leaf with `cryptography` in this process, one after another, same key types
    (target >= 50% of the floor). Measured on the plaintext port and on the TLS port.
(b) agent start -> /healthz/ready 200 with cert and config, p50 over 5 runs, vs Envoy's own
    start-to-ready with a static bootstrap (target <= 1.5x). NOT MEASURED HERE YET: the
    integrator adds it below (see `agent_start_to_ready`) once the agent serves SDS.

Prints one line per figure with the ratio against its floor.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from control.ca.authn import TokenIssuer, load_or_create_token_key
from control.ca.authority import authority_from_state_dir
from control.ca.identity import Identity
from protos import ca_pb2, ca_pb2_grpc
from tests.support.net import free_port


def make_csr() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def floor_rate(state: Path, csrs: list[str], seconds: float) -> float:
    """Signatures per second with cryptography alone, in this process (the same work the CA
    does per request, minus gRPC, authentication and the thread hop)."""
    ca = authority_from_state_dir(state, "cluster.local")
    key, cert = ca.key, ca.cert
    aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key())
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        csr = x509.load_pem_x509_csr(csrs[n % len(csrs)].encode())
        assert csr.is_signature_valid
        now = dt.datetime.now(dt.UTC)
        (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(cert.subject)
            .public_key(csr.public_key())  # type: ignore[arg-type]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(hours=24))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(aki, critical=False)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.UniformResourceIdentifier("spiffe://cluster.local/ns/default/sa/x")]
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        n += 1
    return n / (time.perf_counter() - start)


async def grpc_rate(
    channel: grpc.aio.Channel, token: str, csrs: list[str], seconds: float, concurrency: int
) -> float:
    stub = ca_pb2_grpc.IstioCertificateServiceStub(channel)
    md = (("authorization", f"Bearer {token}"),)
    # Warm up: the connection, the token cache, the server's thread pool.
    for c in csrs[:concurrency]:
        await stub.CreateCertificate(ca_pb2.IstioCertificateRequest(csr=c), metadata=md)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal done
        j = i
        while time.perf_counter() < deadline:
            resp = await stub.CreateCertificate(
                ca_pb2.IstioCertificateRequest(csr=csrs[j % len(csrs)], validity_duration=3600),
                metadata=md,
            )
            assert len(resp.cert_chain) == 2
            done += 1
            j += concurrency

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done / (time.perf_counter() - start)


async def agent_start_to_ready() -> None:
    # ---- (b) agent start -> ready: TO BE ADDED BY THE INTEGRATOR ------------------------
    # Start `python -m agent` (with Envoy) against a control plane on the TLS port with a
    # token, time until /healthz/ready returns 200 with a workload cert and config, p50 over
    # 5 runs; compare with Envoy's own start-to-ready on a static bootstrap measured in this
    # run (tests/support/envoy.py). Target <= 1.5x. Print one line:
    #   print(f"ca (b) agent start->ready p50 ...: ratio {x:.2f}x  (target <= 1.5x)")
    print("ca (b) agent start->ready: not measured yet (added with the agent's SDS)")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pf-ca-"))
    state = tmp / "state"
    token = TokenIssuer(load_or_create_token_key(state)).issue(
        Identity("default", "bench"), 3600, time.time()
    )
    csrs = [make_csr() for _ in range(64)]
    plain, secure = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "control",
            "--state-dir",
            str(state),
            "--xds-address",
            f"127.0.0.1:{plain}",
            "--webhook-address",
            "off",
            "--secure-xds-address",
            f"127.0.0.1:{secure}",
            "--http-address",
            "127.0.0.1:0",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{plain}") as ch:
            await asyncio.wait_for(ch.channel_ready(), 30)
            # The root exists once the control plane listens; the floor signs with it too.
            floor = floor_rate(state, csrs, args.seconds)
            rate = await grpc_rate(ch, token, csrs, args.seconds, args.concurrency)
        root = (state / "root-cert.pem").read_bytes()
        creds = grpc.ssl_channel_credentials(root_certificates=root)
        async with grpc.aio.secure_channel(f"127.0.0.1:{secure}", creds) as ch:
            tls_rate = await grpc_rate(ch, token, csrs, args.seconds, args.concurrency)
    finally:
        proc.terminate()
        proc.wait(15)
    print(f"ca (floor) in-process parse CSR + build + sign (P-256): {floor:.0f} certs/s")
    print(
        f"ca (a) CreateCertificate over gRPC, plaintext port, {args.concurrency} concurrent:"
        f" {rate:.0f} certs/s, {rate / floor * 100:.0f}% of the floor  (target >= 50%)"
    )
    print(
        f"ca (a) CreateCertificate over gRPC, TLS port, {args.concurrency} concurrent:"
        f" {tls_rate:.0f} certs/s, {tls_rate / floor * 100:.0f}% of the floor  (target >= 50%)"
    )
    await agent_start_to_ready()
    print(json.dumps({"floor": floor, "grpc": rate, "grpc_tls": tls_rate}))


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
