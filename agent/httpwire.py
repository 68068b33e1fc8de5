"""The little of HTTP/1.1 the agent speaks (its status server; Envoy's admin API as a client):
request and response heads parsed and rendered, chunked bodies decoded. Sans-IO: bytes in,
values out; agent/httpio.py moves the bytes.

Why not aiohttp: importing it costs ~0.1 s of CPU, and the status server must answer
/healthz/ready as soon as the agent is ready; the agent's whole start is a few hundred
milliseconds (tests/benchmarks/ca.py). The endpoints here are a handful of small GETs and
POSTs from kubelet, Envoy and Prometheus.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_HEAD = 64 << 10
MAX_BODY = 1 << 20  # requests: the status server's endpoints take no body worth reading


class HttpWireError(ValueError):
    """Bytes that are not the HTTP/1.1 we accept."""


@dataclass(frozen=True, slots=True, eq=False)
class RequestHead:
    """An HTTP/1.x request line and headers."""

    method: str
    target: str  # as sent: path and query
    version: str  # "HTTP/1.1" or "HTTP/1.0"
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"

    def body_length(self) -> int:
        """Bytes of body that follow the head; HttpWireError for what we do not take
        (chunked request bodies, a bad or too large Content-Length)."""
        if "transfer-encoding" in self.headers:
            raise HttpWireError("request bodies with Transfer-Encoding are not accepted")
        return _content_length(self.headers, MAX_BODY)


@dataclass(frozen=True, slots=True, eq=False)
class ResponseHead:
    """An HTTP/1.x response's status and headers."""

    status: int
    headers: dict[str, str]

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    def body_length(self) -> int | None:
        """Content-Length, or None: the body is chunked or runs to the end of the stream."""
        if self.chunked or "content-length" not in self.headers:
            return None
        return _content_length(self.headers, 1 << 31)


def _content_length(headers: dict[str, str], limit: int) -> int:
    raw = headers.get("content-length", "0").strip()
    if not (raw.isascii() and raw.isdigit()):  # str.isdigit() also takes "²"
        raise HttpWireError(f"bad Content-Length {raw!r}")
    n = int(raw)
    if n > limit:
        raise HttpWireError(f"body of {n} bytes is too large")
    return n


def _headers(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip():
            raise HttpWireError(f"bad header line {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


def parse_request_head(data: bytes) -> RequestHead:
    """`data`: the request line and headers, up to and including the blank line."""
    lines = data.removesuffix(b"\r\n\r\n").split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1]:
        raise HttpWireError(f"bad request line {lines[0][:80]!r}")
    method, target, version = parts
    if not method.isalpha() or not method.isupper():
        raise HttpWireError(f"bad method {method[:20]!r}")
    return RequestHead(method, target, version, _headers(lines[1:]))


def parse_response_head(data: bytes) -> ResponseHead:
    lines = data.removesuffix(b"\r\n\r\n").split(b"\r\n")
    version, _, rest = lines[0].decode("latin-1").partition(" ")
    code = rest.partition(" ")[0]
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise HttpWireError(f"bad status line {lines[0][:80]!r}")
    return ResponseHead(int(code), _headers(lines[1:]))


# The phrases of the statuses the agent's servers answer with; http.HTTPStatus (an enum of 60
# members, ~0.6 ms to import on the way to the first /healthz/ready) only for any other.
_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def render_response(
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    keep_alive: bool = True,
    head_only: bool = False,
) -> bytes:
    reason = _REASONS.get(status) or _reason(status)
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode("latin-1")
    return head if head_only else head + body


def render_request(method: str, host: str, target: str) -> bytes:
    """A bodiless request that asks the server to close the connection after answering."""
    return (
        f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Length: 0\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")


def chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (extensions ignored)."""
    raw = line.split(b";", 1)[0].strip()
    # int() would also take a sign, underscores and surrounding blanks: hex digits only.
    if not raw or raw.strip(b"0123456789abcdefABCDEF"):
        raise HttpWireError(f"bad chunk size {raw[:20]!r}")
    return int(raw, 16)
