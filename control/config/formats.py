"""Syntax checks for the string formats Kubernetes and Istio use (names, labels, hosts, IPs).

Each function returns None when the value is valid, or a short description of what the value
must look like, for use after `<path>: ` in an error message.
"""

from __future__ import annotations

import ipaddress
import re

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_HOST_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_IANA_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def dns1123_label(value: str) -> str | None:
    """Namespaces, port names: lowercase alphanumerics and '-', at most 63 characters."""
    return _label(value, _DNS1123_LABEL, "DNS label", "starting and ending with a letter or digit")


def dns1035_label(value: str) -> str | None:
    """Kubernetes Service names: a DNS label that starts with a letter."""
    return _label(
        value,
        _DNS1035_LABEL,
        "DNS-1035 label",
        "starting with a letter and ending with a letter or digit",
    )


def _label(value: str, pattern: re.Pattern[str], kind: str, ends: str) -> str | None:
    if len(value) <= 63 and pattern.match(value):
        return None
    return f"must be a {kind}: at most 63 lowercase letters, digits and '-', {ends}"


def dns1123_subdomain(value: str) -> str | None:
    """Object names (Istio kinds), label key prefixes: dot-separated DNS labels, <= 253."""
    if 0 < len(value) <= 253 and all(_DNS1123_LABEL.match(part) for part in value.split(".")):
        return None
    return (
        "must be a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 "
        "characters, each part starting and ending with a letter or digit"
    )


def is_cidr(value: str) -> bool:
    if "/" not in value:
        return False
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def is_hostname(value: str) -> bool:
    """A DNS name such as `api.example.com` or `backend` (no wildcard, no trailing dot)."""
    if not 0 < len(value) <= 253:
        return False
    parts = value.split(".")
    if not all(len(p) <= 63 and _HOST_LABEL.match(p) for p in parts):
        return False
    # An all-numeric last label would be confused with an IPv4 address.
    return not parts[-1].isdigit()


def wildcard_host(value: str) -> str | None:
    """A host as Istio states it: an FQDN, or a wildcard `*.example.com`."""
    if value.startswith("*."):
        if is_hostname(value[2:]):
            return None
    elif is_hostname(value):
        return None
    return "must be a DNS name like api.example.com, or a wildcard like *.example.com"


def label_key(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or dns1123_subdomain(prefix) is not None):
        return f"label key {key!r} has an invalid prefix (must be a DNS subdomain)"
    if not (len(name) <= 63 and _LABEL_NAME.match(name)):
        return (
            f"label key {key!r} is invalid: the name must be at most 63 letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )
    return None


def label_value(value: str) -> str | None:
    if value == "" or (len(value) <= 63 and _LABEL_NAME.match(value)):
        return None
    return (
        f"label value {value!r} is invalid: at most 63 letters, digits, '-', '_' or '.', "
        "starting and ending with a letter or digit"
    )


def port_name(value: str) -> str | None:
    """IANA service name, as a Kubernetes named targetPort: <= 15 chars, one letter at least."""
    if (
        len(value) <= 15
        and _IANA_SVC_NAME.match(value)
        and "--" not in value
        and any(c.isalpha() for c in value)
    ):
        return None
    return (
        "must be a port number 1-65535 or a port name (at most 15 lowercase letters, digits "
        "and '-', with at least one letter)"
    )


def locality(value: str) -> str | None:
    parts = value.split("/")
    if len(parts) <= 3 and all(parts):
        return None
    return "must be region, region/zone or region/zone/subzone"
