"""The CA without sockets: what it signs, for whom, for how long, and where its keys live."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from control.ca.authority import (
    CaError,
    CaLimits,
    CsrError,
    authority_from_files,
    authority_from_state_dir,
    in_memory_authority,
)
from control.ca.identity import Identity
from tests.support.pki import (
    ca_cert,
    cert_pem,
    ec_key,
    key_pem,
    load_chain,
    make_csr,
    spiffe_ids,
    verify_chain,
    write_intermediate_ca,
)

NOW = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
ME = Identity("shop", "checkout")


@pytest.fixture(scope="module")
def ca():  # type: ignore[no-untyped-def]
    return in_memory_authority("example.org", CaLimits(max_workload_ttl=3600), now=NOW)


def test_identity_comes_from_the_caller_never_from_the_csr(ca) -> None:  # type: ignore[no-untyped-def]
    csr = make_csr(san="spiffe://example.org/ns/kube-system/sa/admin", cn="admin")
    chain = load_chain(ca.sign_csr(csr, ME, 600, NOW))
    leaf = chain[0]
    assert spiffe_ids(leaf) == ["spiffe://example.org/ns/shop/sa/checkout"]
    assert len(leaf.subject) == 0  # the CSR's CN is not copied either
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical  # empty subject: RFC 5280 wants the SAN critical
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert len(chain) == 2 and chain[-1] == ca.root
    verify_chain(chain)


def test_validity_is_requested_and_capped(ca) -> None:  # type: ignore[no-untyped-def]
    leaf = load_chain(ca.sign_csr(make_csr(), ME, 20, NOW))[0]
    assert leaf.not_valid_before_utc == NOW
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == dt.timedelta(seconds=20)
    capped = load_chain(ca.sign_csr(make_csr(), ME, 10 * 86400, NOW))[0]
    assert capped.not_valid_after_utc - NOW == dt.timedelta(hours=1)
    default = load_chain(ca.sign_csr(make_csr(), ME, 0, NOW))[0]
    assert default.not_valid_after_utc - NOW == dt.timedelta(hours=1)
    with pytest.raises(CsrError, match="negative"):
        ca.sign_csr(make_csr(), ME, -5, NOW)


def test_validity_never_outlives_the_ca() -> None:
    key = ec_key()
    short_root = ca_cert("short", key, days=1)
    from control.ca.authority import CertificateAuthority

    ca = CertificateAuthority(short_root, key, (), "cluster.local", CaLimits(7 * 86400))
    now = dt.datetime.now(dt.UTC)
    leaf = load_chain(ca.sign_csr(make_csr(), ME, 7 * 86400, now))[0]
    assert leaf.not_valid_after_utc <= short_root.not_valid_after_utc


@pytest.mark.parametrize(
    "key",
    [
        ec.generate_private_key(ec.SECP384R1()),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    ],
    ids=["p384", "rsa2048"],
)
def test_accepted_key_types(ca, key) -> None:  # type: ignore[no-untyped-def]
    leaf = load_chain(ca.sign_csr(make_csr(key), ME, 60, NOW))[0]
    assert leaf.public_key().public_numbers() == key.public_key().public_numbers()


@pytest.mark.parametrize(
    ("key", "match"),
    [
        (rsa.generate_private_key(public_exponent=65537, key_size=1024), "RSA 1024"),
        (ec.generate_private_key(ec.SECP521R1()), "secp521r1"),
        (ec.generate_private_key(ec.SECP256K1()), "secp256k1"),
        (ed25519.Ed25519PrivateKey.generate(), "Ed25519"),
    ],
    ids=["rsa1024", "p521", "k256", "ed25519"],
)
def test_refused_key_types(ca, key, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CsrError, match=match):
        ca.sign_csr(make_csr(key), ME, 60, NOW)


def test_malformed_and_forged_csrs_are_refused(ca) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CsrError, match="not a PEM"):
        ca.sign_csr(b"hello", ME, 60, NOW)
    # A CSR whose public key was swapped: its signature no longer matches.
    csr = x509.load_pem_x509_csr(make_csr())
    other = x509.load_pem_x509_csr(make_csr())
    from cryptography.hazmat.primitives import serialization

    der = bytearray(csr.public_bytes(serialization.Encoding.DER))
    mine = csr.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    theirs = other.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    at = bytes(der).index(mine)
    der[at : at + len(mine)] = theirs
    import base64

    forged = (
        b"-----BEGIN CERTIFICATE REQUEST-----\n"
        + base64.encodebytes(bytes(der))
        + b"-----END CERTIFICATE REQUEST-----\n"
    )
    with pytest.raises(CsrError, match="signature"):
        ca.sign_csr(forged, ME, 60, NOW)


def test_state_dir_root_is_created_private_and_reused(tmp_path: Path) -> None:
    d = tmp_path / "state"
    first = authority_from_state_dir(d, "cluster.local")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "root-key.pem").stat().st_mode) == 0o600
    again = authority_from_state_dir(d, "cluster.local")
    assert again.root == first.root and again.root_pem == first.root_pem
    (d / "root-key.pem").unlink()
    with pytest.raises(CaError, match=r"root-key\.pem is missing"):
        authority_from_state_dir(d, "cluster.local")


def test_plugged_in_intermediate_gives_a_three_certificate_chain(tmp_path: Path) -> None:
    cert, key, chain, root = write_intermediate_ca(tmp_path)
    ca = authority_from_files(cert, key, chain, "cluster.local")
    pems = ca.sign_csr(make_csr(), ME, 60, NOW.replace(year=dt.datetime.now().year))
    certs = load_chain(pems)
    assert len(certs) == 3 and certs[-1] == root
    assert certs[1] == x509.load_pem_x509_certificate(cert.read_bytes())
    verify_chain(certs)
    # Without the chain the root is unknown: refused at load time, not at signing time.
    with pytest.raises(CaError, match="not a self-signed root"):
        authority_from_files(cert, key, None, "cluster.local")


def test_plugged_in_ca_problems_are_clear(tmp_path: Path) -> None:
    key = ec_key()
    root = ca_cert("r", key)
    (tmp_path / "c.pem").write_bytes(cert_pem(root))
    (tmp_path / "other.pem").write_bytes(key_pem(ec_key()))
    with pytest.raises(CaError, match="does not belong"):
        authority_from_files(tmp_path / "c.pem", tmp_path / "other.pem", None, "td")
    leaf_key = ec_key()
    (tmp_path / "leaf.pem").write_bytes(cert_pem(ca_cert("leaf", leaf_key, is_ca=False)))
    (tmp_path / "leaf-key.pem").write_bytes(key_pem(leaf_key))
    with pytest.raises(CaError, match="not a CA certificate"):
        authority_from_files(tmp_path / "leaf.pem", tmp_path / "leaf-key.pem", None, "td")
    with pytest.raises(CaError, match="cannot read"):
        authority_from_files(tmp_path / "nope.pem", tmp_path / "other.pem", None, "td")
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(CaError, match="no PEM private key"):
        authority_from_files(tmp_path / "c.pem", tmp_path / "junk.pem", None, "td")


def test_serving_certificate_names(ca) -> None:  # type: ignore[no-untyped-def]
    pems, key = ca.issue_serving_cert(
        ["localhost", "istiod.istio-system.svc", "cp-1"], ["127.0.0.9", "127.0.0.1"], NOW
    )
    leaf = load_chain(pems)[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "localhost",
        "istiod.istio-system.svc",
        "cp-1",
    ]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == [
        "127.0.0.9",
        "127.0.0.1",
    ]
    assert b"PRIVATE KEY" in key
    verify_chain(load_chain(pems))
