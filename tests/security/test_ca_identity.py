"""CSRs that ask for someone else's identity: the CA issues the authenticated caller's SPIFFE
ID (token or client certificate) and nothing the CSR names, on every port."""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from control.app import ControlPlane
from control.ca.identity import Identity
from tests.security.common import create_cert, tls_channel, token
from tests.support.pki import cert_pem, ec_key, key_pem, make_csr, spiffe_ids, verify_chain

ADMIN = "spiffe://cluster.local/ns/kube-system/sa/admin"
CART = Identity("shop", "cart")


def _greedy_csr() -> bytes:
    """A CSR naming another namespace's service account, another trust domain, a DNS name
    and a CN: everything a naive CA might copy."""
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")]))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.UniformResourceIdentifier(ADMIN),
                    x509.UniformResourceIdentifier("spiffe://evil.example/ns/default/sa/sleep"),
                    x509.DNSName("istiod.istio-system.svc"),
                ]
            ),
            critical=False,
        )
    )
    return builder.sign(ec_key(), hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _only_identity(cert: x509.Certificate, want: str) -> None:
    assert spiffe_ids(cert) == [want]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == []
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME) == []


async def test_csr_naming_another_spiffe_id_gets_the_callers_identity(cp: ControlPlane) -> None:
    csr = _greedy_csr()
    # A bearer token on the TLS port (the plaintext port signs nothing:
    # tests/security/test_registration.py).
    async with tls_channel(cp, cp.secure_xds_port) as tls:
        chain = await create_cert(tls, csr, token(cp))
    verify_chain(chain)
    _only_identity(chain[0], "spiffe://cluster.local/ns/default/sa/sleep")
    async with tls_channel(cp, cp.secure_xds_port) as tls:
        chain = await create_cert(tls, csr, token(cp, CART))
    _only_identity(chain[0], "spiffe://cluster.local/ns/shop/sa/cart")

    # A client certificate on the mTLS port (no token): the certificate names the caller.
    key = ec_key()
    async with tls_channel(cp, cp.secure_xds_port) as tls:
        own = await create_cert(tls, make_csr(key), token(cp, CART))
    chain_pem = b"".join(cert_pem(c) for c in own[:-1])
    async with tls_channel(
        cp, cp.mtls_xds_port, private_key=key_pem(key), certificate_chain=chain_pem
    ) as mtls:
        chain = await create_cert(mtls, csr, None)
    _only_identity(chain[0], "spiffe://cluster.local/ns/shop/sa/cart")
    issued = cp.metrics.registry.get_sample_value(
        "citadel_server_success_cert_issuance_count_total"
    )
    assert issued == 4
