"""The `v1 Secret` kind: gateway certificates from config files (sans-IO, real certificates)."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from control.config.errors import ConfigError
from control.config.loader import load_text
from control.config.merge import merge
from control.model.secret import TlsSecret
from tests.support.pki import ca_cert, cert_pem, key_pem
from tests.support.secrets import secret_object, secret_yaml
from tests.support.testca import IssuedCert, TestCA

_CA = TestCA()
# A gateway certificate with its CA, as a config file holds it (also in the config fuzz corpus).
GW_SECRET = secret_yaml(
    "gw-cert", _CA.server_cert(["gw.example.com"]), namespace="edge", ca=_CA.root_pem
)


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return _CA


def _secrets(text: str) -> tuple[TlsSecret, ...]:
    return merge([load_text(text, "gw.yaml")]).secrets


def test_a_tls_secret_from_base64_data(ca: TestCA) -> None:
    cert = ca.server_cert(["gw.example.com"])
    (secret,) = _secrets(secret_yaml("gw-cert", cert, namespace="edge", ca=ca.root_pem))
    assert (secret.namespace, secret.name) == ("edge", "gw-cert")
    assert secret.cert_chain == cert.cert_pem and secret.private_key == cert.key_pem
    assert secret.ca_cert == ca.root_pem
    # Key material never shows in a repr (logs, debug output).
    assert cert.key_pem.decode() not in repr(secret) and "BEGIN" not in repr(secret)


def test_string_data_wins_over_data_and_opaque_works(ca: TestCA) -> None:
    old, new = ca.server_cert(["a"]), ca.server_cert(["a"])
    obj = secret_object("gw", old, secret_type="Opaque")
    obj["stringData"] = {"tls.crt": new.cert_pem.decode(), "tls.key": new.key_pem.decode()}
    (secret,) = _secrets(json.dumps(obj))
    assert secret.cert_chain == new.cert_pem and secret.private_key == new.key_pem


def test_a_ca_only_secret_and_unrelated_secrets(ca: TestCA) -> None:
    text = secret_yaml("gw-cacert", None, ca=ca.root_pem, secret_type="Opaque")
    other = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "type": "Opaque"}
    other["data"] = {"password": base64.b64encode(b"hunter2").decode()}
    token = {**other, "metadata": {"name": "sa"}, "type": "kubernetes.io/service-account-token"}
    loaded = load_text(text + "---\n" + json.dumps(other) + "\n---\n" + json.dumps(token), "x")
    (secret,) = merge([loaded]).secrets
    assert secret.has_ca and not secret.has_certificate
    # Not gateway certificates: skipped without a warning (a cluster is full of them).
    assert loaded.warnings == ()


def _error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(text, "gw.yaml")
    return info.value


def test_errors_name_the_key_and_the_line_and_never_echo_key_material(ca: TestCA) -> None:
    cert, other = ca.server_cert(["a"]), ca.server_cert(["b"])
    mismatched = secret_object("gw", cert)
    mismatched["data"]["tls.key"] = base64.b64encode(other.key_pem).decode()
    text = "\n".join(["---"] + [f"# {i}" for i in range(3)] + [json.dumps(mismatched, indent=2)])
    err = _error(text)
    assert "tls.key does not belong to the first certificate of tls.crt" in str(err)
    assert str(err).startswith("gw.yaml:") and err.line > 4
    for secret_bytes in (cert.key_pem, other.key_pem):
        assert base64.b64encode(secret_bytes).decode()[:40] not in str(err)
        assert secret_bytes.decode()[30:70] not in str(err)

    bad64 = secret_object("gw", cert)
    bad64["data"]["tls.key"] = "not base64!!"
    err = _error(json.dumps(bad64))
    assert "data['tls.key']: is not valid base64" in str(err) and "not base64!!" not in str(err)

    missing = secret_object("gw", cert)
    del missing["data"]["tls.key"]
    assert "tls.key is required in a Secret of type kubernetes.io/tls" in str(
        _error(json.dumps(missing))
    )

    garbage = secret_object("gw", cert)
    garbage["data"]["tls.crt"] = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nxx").decode()
    assert "tls.crt holds no valid PEM certificate" in str(_error(json.dumps(garbage)))

    bad_key = secret_object("gw", cert)
    bad_key["data"]["tls.key"] = base64.b64encode(b"secret-ish junk").decode()
    err = _error(json.dumps(bad_key))
    assert "tls.key holds no valid PEM private key" in str(err) and "junk" not in str(err)

    half = secret_object("gw", cert, secret_type="Opaque")
    del half["data"]["tls.crt"]
    assert "tls.crt is required with tls.key" in str(_error(json.dumps(half)))


def test_configz_shows_the_secret_redacted(ca: TestCA) -> None:
    cert = ca.server_cert(["a"])
    obj = secret_object("gw", cert)
    obj["stringData"] = {"extra": "plain secret text"}
    config = merge([load_text(json.dumps(obj), "gw.yaml")])
    ((_, raw),) = config.raw
    assert raw["data"] == {"tls.crt": "<redacted>", "tls.key": "<redacted>"}
    assert raw["stringData"] == {"extra": "<redacted>"}
    assert "plain secret text" not in json.dumps(raw)
    assert raw["metadata"]["name"] == "gw" and raw["type"] == "kubernetes.io/tls"


def test_an_rsa_certificate_and_key_load_and_a_wrong_rsa_key_is_refused() -> None:
    key, other = (rsa.generate_private_key(65537, 2048) for _ in range(2))
    cert = ca_cert("gw.example.com", key, is_ca=False)
    good = IssuedCert(cert_pem(cert), key_pem(key), cert.serial_number)
    (secret,) = _secrets(secret_yaml("gw", good))
    assert secret.private_key == good.key_pem
    bad = IssuedCert(cert_pem(cert), key_pem(other), cert.serial_number)
    assert "does not belong" in str(_error(secret_yaml("gw", bad)))


def test_empty_certificate_keys_are_a_certificate_not_issued_yet() -> None:
    obj = secret_object("pending", None)
    obj["data"] = {"tls.crt": "", "tls.key": ""}
    loaded = load_text(json.dumps(obj), "gw.yaml")
    assert merge([loaded]).secrets == () and loaded.warnings == ()
    obj["data"]["ca.crt"] = base64.b64encode(_CA.root_pem).decode()
    (secret,) = _secrets(json.dumps(obj))
    assert secret.has_ca and not secret.has_certificate
