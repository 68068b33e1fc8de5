"""The certificate authority: its signing key and chain, and the rules for what it signs.

Sans-IO at its core: `sign_csr` takes CSR bytes, the authenticated identity and `now`, and
returns the PEM chain; it does no I/O and never looks at the identities the CSR asks for. The
loaders at the bottom read or create the key material (blocking file I/O; the control plane
calls them through asyncio.to_thread); `sign_csr`, ~0.2 ms of crypto, runs in the CA's
signing worker process (control/ca/signworker.py).

Where the CA comes from:
- `--ca-cert/--ca-key[/--ca-chain]`: a plugged-in root, or an intermediate whose chain up to
  the root is in `--ca-chain`; nothing is written.
- otherwise `--state-dir`: `root-cert.pem` + `root-key.pem` (0600, directory 0700), created on
  first start and reused afterwards;
- no state dir (tests, `ControlPlaneOptions(state_dir="")`): a fresh self-signed root that
  lives only in memory, for the life of the process.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import itertools
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from control.ca.identity import Identity

logger = logging.getLogger(__name__)

ROOT_CERT_FILE = "root-cert.pem"
ROOT_KEY_FILE = "root-key.pem"
ROOT_VALIDITY = dt.timedelta(days=3650)
SERVING_VALIDITY = dt.timedelta(days=365)
MIN_RSA_BITS = 2048
MAX_RSA_BITS = 8192  # bigger keys only cost the CA time; nobody needs them
_CURVES = {"secp256r1", "secp384r1"}

CaKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class CaError(Exception):
    """The CA's key material cannot be used (bad files, mismatched key, broken chain)."""


class CsrError(ValueError):
    """A certificate signing request the CA refuses (malformed, bad signature, weak key)."""


@dataclass(frozen=True, slots=True)
class CaLimits:
    max_workload_ttl: float = 24 * 3600.0  # seconds; also the lifetime when none is asked for


class CertificateAuthority:
    """Signs workload and serving certificates with one key and presents its chain."""

    def __init__(
        self,
        cert: x509.Certificate,
        key: CaKey,
        chain: Sequence[x509.Certificate],
        trust_domain: str,
        limits: CaLimits = CaLimits(),
    ) -> None:
        """`chain`: the certificates above `cert`, ending with the root (empty when `cert` is
        the root itself). Checked here: a CA that would hand out unverifiable chains must
        not start."""
        _check_ca(cert, key, chain)
        self.cert = cert
        self.key = key
        self.trust_domain = trust_domain
        self.limits = limits
        self._hash = _hash_for(key)
        self._aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key())
        certs = [cert, *chain]
        self.root = certs[-1]
        # Appended after every leaf: the signing cert, any intermediates, the root last.
        self.chain_pems = [_pem(c) for c in certs]
        self.root_pem = self.chain_pems[-1]

    @property
    def not_after(self) -> dt.datetime:
        return min(c.not_valid_after_utc for c in (self.cert, self.root))

    # --- signing ---------------------------------------------------------------------------

    def sign_csr(
        self, csr_pem: bytes, identity: Identity, ttl_seconds: float, now: dt.datetime
    ) -> list[str]:
        """A leaf for `identity` (never the CSR's own SANs or subject) with the CSR's public
        key, valid from `now` for `ttl_seconds` (0: the maximum), capped by the maximum
        workload TTL and by the CA's own expiry. Returns PEMs, leaf first and root last."""
        public_key = _csr_public_key(csr_pem)
        if ttl_seconds < 0:
            raise CsrError(f"validity_duration {ttl_seconds} is negative")
        ttl = min(ttl_seconds or self.limits.max_workload_ttl, self.limits.max_workload_ttl)
        leaf = self._leaf(
            public_key,
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(identity.spiffe_id(self.trust_domain))]
            ),
            x509.Name([]),
            ttl,
            now,
            server_only=False,
        )
        return [_pem(leaf), *self.chain_pems]

    def issue_serving_cert(
        self,
        dns_names: Sequence[str],
        ips: Sequence[str],
        now: dt.datetime,
        validity: dt.timedelta = SERVING_VALIDITY,
    ) -> tuple[list[str], bytes]:
        """The control plane's own TLS certificate: a fresh P-256 key, DNS and IP SANs.
        Returns (PEM chain leaf first, PEM private key)."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys(dns_names) if n]
        for ip in dict.fromkeys(ips):
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(ip)))
            except ValueError:
                names.append(x509.DNSName(ip))  # a host name given as an address's host
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pilotfish-control")])
        leaf = self._leaf(
            key.public_key(),
            x509.SubjectAlternativeName(names),
            subject,
            validity.total_seconds(),
            now,
            server_only=True,
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return [_pem(leaf), *self.chain_pems], key_pem

    def _leaf(
        self,
        public_key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey,
        san: x509.SubjectAlternativeName,
        subject: x509.Name,
        ttl: float,
        now: dt.datetime,
        *,
        server_only: bool,
    ) -> x509.Certificate:
        # No backdating: rotation at half the lifetime reads not_before..not_after, and a
        # 20-second certificate must be 20 seconds long, not 20 plus a skew allowance.
        start = now.replace(microsecond=0)
        end = min(start + dt.timedelta(seconds=max(1.0, ttl)), self.not_after)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH]
        if not server_only:
            usage.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                _key_usage(ca=False, key_encipherment=isinstance(public_key, rsa.RSAPublicKey)),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(self._aki, critical=False)
            # RFC 5280 4.2.1.6: with an empty subject the SAN extension must be critical.
            .add_extension(san, critical=len(subject) == 0)
        )
        return builder.sign(self.key, self._hash)


# --- CSR checks ----------------------------------------------------------------------------


def _csr_public_key(csr_pem: bytes) -> ec.EllipticCurvePublicKey | rsa.RSAPublicKey:
    """The key of a well-formed, self-signed CSR with an allowed key, or CsrError."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as e:
        raise CsrError(f"csr is not a PEM certificate signing request: {e}") from None
    try:
        valid = csr.is_signature_valid
    except (ValueError, InvalidSignature, TypeError) as e:
        raise CsrError(f"csr signature cannot be checked: {e}") from None
    if not valid:
        raise CsrError("csr signature is not valid (the CSR was not signed by its own key)")
    try:
        key = csr.public_key()
    except ValueError as e:
        raise CsrError(f"csr public key cannot be read: {e}") from None
    check_key_strength(key, what="csr key")
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):  # for the type checker
        raise CsrError(f"csr key: {type(key).__name__} is not allowed (ECDSA or RSA)")
    return key


def check_key_strength(key: object, *, what: str) -> None:
    """ECDSA P-256/P-384 or RSA 2048..8192 bits; anything else is refused."""
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        if key.curve.name not in _CURVES:
            raise CsrError(f"{what}: curve {key.curve.name} is not allowed (P-256 or P-384)")
    elif isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        if not MIN_RSA_BITS <= key.key_size <= MAX_RSA_BITS:
            raise CsrError(
                f"{what}: RSA {key.key_size} bits is not allowed ({MIN_RSA_BITS}..{MAX_RSA_BITS})"
            )
    else:
        raise CsrError(f"{what}: {type(key).__name__} is not allowed (ECDSA or RSA)")


def _hash_for(key: CaKey) -> hashes.SHA256 | hashes.SHA384:
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1":
        return hashes.SHA384()
    return hashes.SHA256()


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _check_ca(cert: x509.Certificate, key: CaKey, chain: Sequence[x509.Certificate]) -> None:
    try:
        check_key_strength(key, what="CA key")
    except CsrError as e:
        raise CaError(str(e)) from None
    if cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise CaError("the CA key does not belong to the CA certificate")
    certs = [cert, *chain]
    for c in certs:
        try:
            bc = c.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            bc = None
        if bc is None or not bc.ca:
            raise CaError(f"{c.subject.rfc4514_string()!r} is not a CA certificate")
    for child, parent in itertools.pairwise(certs):
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature):
            raise CaError(
                f"chain is broken: {child.subject.rfc4514_string()!r} is not signed by "
                f"{parent.subject.rfc4514_string()!r}"
            ) from None
    root = certs[-1]
    try:
        root.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        raise CaError(
            f"{root.subject.rfc4514_string()!r} is not a self-signed root: give the "
            "certificates up to the root in --ca-chain"
        ) from None


# --- loading and creating ------------------------------------------------------------------


def self_signed_root(
    trust_domain: str, now: dt.datetime, validity: dt.timedelta = ROOT_VALIDITY
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, trust_domain),
            x509.NameAttribute(NameOID.COMMON_NAME, "Pilotfish root CA"),
        ]
    )
    start = now.replace(microsecond=0)
    return root_certificate(key, name, start, start + validity), key


def _key_usage(*, ca: bool, key_encipherment: bool = False) -> x509.KeyUsage:
    """A CA signs certificates and CRLs; a leaf signs (and an RSA leaf enciphers keys)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def root_certificate(
    key: ec.EllipticCurvePrivateKey,
    name: x509.Name,
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> x509.Certificate:
    """A self-signed CA certificate (cert and CRL signing only) for `key`. Tests' CAs are
    made with it too, so they issue from the same kind of root as ours."""
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def in_memory_authority(
    trust_domain: str, limits: CaLimits = CaLimits(), now: dt.datetime | None = None
) -> CertificateAuthority:
    cert, key = self_signed_root(trust_domain, now or dt.datetime.now(dt.UTC))
    return CertificateAuthority(cert, key, (), trust_domain, limits)


def authority_from_files(
    cert_path: str | os.PathLike[str],
    key_path: str | os.PathLike[str],
    chain_path: str | os.PathLike[str] | None,
    trust_domain: str,
    limits: CaLimits = CaLimits(),
) -> CertificateAuthority:
    """A plugged-in CA (blocking: reads files)."""
    certs = _read_certs(cert_path, "--ca-cert")
    cert = certs[0]
    chain = certs[1:]
    if chain_path:
        chain = _read_certs(chain_path, "--ca-chain")
    # A chain file often starts with the signing cert itself (Istio's cert-chain.pem does).
    if chain and chain[0] == cert:
        chain = chain[1:]
    key = _read_key(key_path, "--ca-key")
    return CertificateAuthority(cert, key, chain, trust_domain, limits)


def authority_from_state_dir(
    state_dir: str | os.PathLike[str],
    trust_domain: str,
    limits: CaLimits = CaLimits(),
    now: dt.datetime | None = None,
) -> CertificateAuthority:
    """The root in `state_dir`, created there on first use (blocking: file I/O, keygen)."""
    d = Path(state_dir)
    cert_file, key_file = d / ROOT_CERT_FILE, d / ROOT_KEY_FILE
    have_cert, have_key = cert_file.exists(), key_file.exists()
    if have_cert != have_key:
        missing = key_file if have_cert else cert_file
        raise CaError(f"{missing} is missing (the state dir holds only half of the CA)")
    if not have_cert:
        cert, key = self_signed_root(trust_domain, now or dt.datetime.now(dt.UTC))
        make_private_dir(d)
        # Key first: a crash between the two writes leaves no certificate without its key
        # to be mistaken for a usable CA (the half-CA check above reports it clearly).
        write_private(
            key_file,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        write_private(cert_file, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        logger.info("created a self-signed root CA in %s", d)
        return CertificateAuthority(cert, key, (), trust_domain, limits)
    mode = key_file.stat().st_mode & 0o777
    if mode & 0o077:
        logger.warning("%s is readable by others (mode %o); it should be 0600", key_file, mode)
    return authority_from_files(cert_file, key_file, None, trust_domain, limits)


def make_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write atomically; the file never exists with wider permissions than `mode`."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # created 0600
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)  # the umask may have narrowed it; never widened
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_certs(path: str | os.PathLike[str], flag: str) -> list[x509.Certificate]:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CaError(f"{flag}: cannot read {path}: {e.strerror or e}") from None
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CaError(f"{flag}: {path} holds no PEM certificate") from None
    return certs


def _read_key(path: str | os.PathLike[str], flag: str) -> CaKey:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CaError(f"{flag}: cannot read {path}: {e.strerror or e}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise CaError(f"{flag}: {path} is encrypted; give an unencrypted key") from None
    except ValueError:
        raise CaError(f"{flag}: {path} holds no PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CaError(f"{flag}: {type(key).__name__} keys are not supported (ECDSA or RSA)")
    return key
