"""Workload key and CSR (agent/sds/keys.py): real keys and CSRs, parsed back with cryptography."""

from __future__ import annotations

import asyncio
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from agent.sds import keys
from agent.sds.keys import KeyType, generate_key_and_csr, new_key_and_csr, spiffe_id

ID = "spiffe://cluster.local/ns/shop/sa/cart"


def test_spiffe_id_layout() -> None:
    assert spiffe_id("cluster.local", "shop", "cart") == ID


@pytest.mark.parametrize(("td", "ns", "sa"), [("", "a", "b"), ("td", "a/b", "c"), ("td", "a", "")])
def test_spiffe_id_rejects_bad_parts(td: str, ns: str, sa: str) -> None:
    with pytest.raises(ValueError, match="SPIFFE"):
        spiffe_id(td, ns, sa)


def _san_uris(csr: x509.CertificateSigningRequest) -> list[str]:
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.UniformResourceIdentifier)


def test_default_key_is_ecdsa_p256_and_csr_names_the_spiffe_id() -> None:
    kc = generate_key_and_csr(ID)
    key = serialization.load_pem_private_key(kc.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    assert kc.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, unencrypted
    csr = x509.load_pem_x509_csr(kc.csr_pem)
    assert csr.is_signature_valid
    assert _san_uris(csr) == [ID]
    # The CSR is for our key.
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    assert csr.public_key().public_bytes(der, spki) == key.public_key().public_bytes(der, spki)


def test_rsa_2048_option() -> None:
    kc = generate_key_and_csr(ID, KeyType.RSA_2048)
    key = serialization.load_pem_private_key(kc.key_pem, password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    assert key.key_size == 2048
    csr = x509.load_pem_x509_csr(kc.csr_pem)
    assert isinstance(csr.public_key(), rsa.RSAPublicKey)
    assert _san_uris(csr) == [ID]


def test_every_call_makes_a_new_key() -> None:
    assert generate_key_and_csr(ID).key_pem != generate_key_and_csr(ID).key_pem


def test_identity_must_be_a_spiffe_uri() -> None:
    with pytest.raises(ValueError, match="SPIFFE"):
        generate_key_and_csr("cart.shop")


async def test_async_generation_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    real = keys.generate_key_and_csr

    def spy(identity: str, key_type: KeyType = KeyType.EC_P256) -> keys.KeyAndCsr:
        threads.append(threading.get_ident())
        return real(identity, key_type)

    monkeypatch.setattr(keys, "generate_key_and_csr", spy)
    loop_thread = threading.get_ident()
    kc = await new_key_and_csr(ID)
    assert threads and threads[0] != loop_thread
    assert _san_uris(x509.load_pem_x509_csr(kc.csr_pem)) == [ID]
    # And concurrently: two generations do not serialize on the loop.
    a, b = await asyncio.gather(new_key_and_csr(ID), new_key_and_csr(ID))
    assert a.key_pem != b.key_pem
