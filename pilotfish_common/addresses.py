"""IP address checks."""

from __future__ import annotations

import ipaddress


def is_ip(value: str) -> bool:
    """An IPv4 or IPv6 address (no port, no brackets, no prefix length)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
