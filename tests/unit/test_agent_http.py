"""The agent's small HTTP/1.1 (agent/httpwire.py sans-IO, agent/httpio.py over real sockets):
what the status server and the Envoy admin client rely on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.httpio import HttpClientError, HttpServer, Request, Response, fetch
from agent.httpwire import (
    _REASONS,
    HttpWireError,
    chunk_size,
    parse_request_head,
    parse_response_head,
    render_request,
    render_response,
)
from tests.support.net import pod_ip


def test_request_heads() -> None:
    head = parse_request_head(
        b"GET /healthz/ready?x=1 HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
    )
    assert (head.method, head.path, head.target) == ("GET", "/healthz/ready", "/healthz/ready?x=1")
    assert head.headers == {"host": "a", "x-a": "1, 2"}
    assert head.keep_alive and head.body_length() == 0
    assert not parse_request_head(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive
    assert not parse_request_head(b"GET / HTTP/1.0\r\n\r\n").keep_alive
    post = parse_request_head(b"POST /drain HTTP/1.1\r\nContent-Length: 5\r\n\r\n")
    assert post.body_length() == 5


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /\r\n\r\n",
        b"GET / HTTP/2\r\n\r\n",
        b"get / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
        b"GET / HTTP/1.1\r\n Host: folded\r\n\r\n",
    ],
)
def test_bad_request_heads_are_refused(raw: bytes) -> None:
    with pytest.raises(HttpWireError):
        parse_request_head(raw)


@pytest.mark.parametrize(
    "headers",
    [
        b"Content-Length: -1\r\n",
        b"Content-Length: 99999999\r\n",
        b"Transfer-Encoding: chunked\r\n",
    ],
)
def test_request_bodies_we_do_not_take(headers: bytes) -> None:
    head = parse_request_head(b"POST /drain HTTP/1.1\r\n" + headers + b"\r\n")
    with pytest.raises(HttpWireError):
        head.body_length()


def test_response_heads_and_rendering() -> None:
    raw = render_response(503, b"not yet\n", keep_alive=False)
    head_raw, _, body = raw.partition(b"\r\n\r\n")
    head = parse_response_head(head_raw + b"\r\n\r\n")
    assert head.status == 503 and body == b"not yet\n"
    assert head.headers["connection"] == "close" and head.body_length() == 8
    assert b"\r\n\r\n" in render_response(200, b"x", head_only=True)
    assert not render_response(200, b"x", head_only=True).endswith(b"x")
    chunked = parse_response_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert chunked.chunked and chunked.body_length() is None
    assert render_request("POST", "h:1", "/x?y").startswith(b"POST /x?y HTTP/1.1\r\nHost: h:1")
    assert chunk_size(b"1a;ext=1\r\n") == 26
    with pytest.raises(HttpWireError):
        chunk_size(b"zz\r\n")
    with pytest.raises(HttpWireError):
        parse_response_head(b"SPDY/3 200 OK\r\n\r\n")


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, int]]:
    async def hello(request: Request) -> Response:
        return Response.text(f"hello {request.remote}\n")

    async def boom(request: Request) -> Response:
        raise RuntimeError("boom")

    ip = pod_ip()
    srv = HttpServer({"/hello": {"GET": hello}, "/boom": {"POST": boom}})
    port = await srv.start(ip, 0)
    try:
        yield ip, port
    finally:
        await srv.close()


async def test_server_routes_methods_and_errors(server: tuple[str, int]) -> None:
    ip, port = server
    base = f"http://{ip}:{port}"
    status, body = await fetch(base + "/hello")
    assert status == 200 and body.startswith(b"hello 127.")  # the caller's address
    assert await fetch(base + "/hello", "HEAD") == (200, b"")
    assert (await fetch(base + "/hello", "POST"))[0] == 405
    assert (await fetch(base + "/nope"))[0] == 404
    assert (await fetch(base + "/boom", "POST"))[0] == 500


async def test_server_keeps_a_connection_alive_and_refuses_garbage(
    server: tuple[str, int],
) -> None:
    ip, port = server
    reader, writer = await asyncio.open_connection(ip, port)
    try:
        for _ in range(2):  # two requests on one connection, the first with a body
            writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            head = parse_response_head(await reader.readuntil(b"\r\n\r\n"))
            assert head.status == 200 and head.headers["connection"] == "keep-alive"
            await reader.readexactly(head.body_length() or 0)
        writer.write(b"NOT HTTP\r\n\r\n")
        head = parse_response_head(await reader.readuntil(b"\r\n\r\n"))
        assert head.status == 400 and head.headers["connection"] == "close"
        await reader.readexactly(head.body_length() or 0)
        assert await reader.read() == b""  # and the server closed the connection
    finally:
        writer.close()


async def test_client_reads_chunked_and_until_close_bodies() -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\nTrailer: t\r\n\r\n",
        b"HTTP/1.1 201 Created\r\n\r\nuntil the end",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    ]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answers.pop(0))
        writer.close()

    ip = pod_ip()
    srv = await asyncio.start_server(answer, ip, 0)
    url = f"http://{ip}:{srv.sockets[0].getsockname()[1]}/stats"
    try:
        assert await fetch(url) == (200, b"hello, world")
        assert await fetch(url) == (201, b"until the end")
        with pytest.raises(HttpClientError):
            await fetch(url)  # the body ended early
    finally:
        srv.close()
        await srv.wait_closed()
    with pytest.raises(OSError):
        await fetch(url)  # nobody listens any more
    with pytest.raises(ValueError):
        await fetch("https://example.invalid/")


_HEAD_PARTS = st.sampled_from(
    [
        b"GET",
        b"POST",
        b"get",
        b" ",
        b"/healthz/ready",
        b"?x=1",
        b"HTTP/1.1",
        b"HTTP/1.0",
        b"HTTP/2",
        b"\r\n",
        b":",
        b"Content-Length",
        b"Transfer-Encoding",
        b"chunked",
        b"-1",
        b"99999999999999999999",
        b"\x00",
        b"\xff",
        b"Connection",
        b"close",
        b"\t",
        b"200",
        b"\xb2",
        b"_",
        b"+",
        b"OK",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.lists(_HEAD_PARTS, max_size=30).map(b"".join)))
def test_any_bytes_parse_or_raise_the_wire_error(raw: bytes) -> None:
    # What a client on the pod network may send: a value or HttpWireError, nothing else.
    head = raw + b"\r\n\r\n"
    for parse in (parse_request_head, parse_response_head):
        try:
            parsed = parse(head)
        except HttpWireError:
            continue
        try:
            parsed.body_length()
        except HttpWireError:
            pass
    try:
        chunk_size(raw)
    except HttpWireError:
        pass


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",  # "²": str.isdigit() says yes
        b"GET / HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
    ],
)
def test_content_length_is_ascii_digits_only(head: bytes) -> None:
    with pytest.raises(HttpWireError):
        parse_request_head(head).body_length()


@pytest.mark.parametrize("line", [b"-1\r\n", b"+a\r\n", b"1_0\r\n", b"\r\n", b" \r\n"])
def test_chunk_size_is_hex_digits_only(line: bytes) -> None:
    with pytest.raises(HttpWireError):
        chunk_size(line)


def test_reason_phrases_are_http_status_phrases() -> None:
    """The agent's own table of reason phrases (no http.HTTPStatus on the way to ready) says
    what HTTPStatus says, and a status outside it still gets its phrase."""
    from http import HTTPStatus

    for status, phrase in _REASONS.items():
        assert HTTPStatus(status).phrase == phrase
    assert render_response(418, b"").startswith(b"HTTP/1.1 418 I'm a Teapot\r\n")
    assert render_response(599, b"").startswith(b"HTTP/1.1 599 Unknown\r\n")
