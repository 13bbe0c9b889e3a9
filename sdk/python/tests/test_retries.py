"""What the clients do when the server is down or says "later": typed errors naming the URL,
and 429s (and 503s with Retry-After) sent again within a bound.

"Later" comes from a small HTTP server on 127.0.0.1 in front of the real `kennel serve`: it
answers the first requests with the status it is told, then passes every request on to the
server and its answer back, so what finally succeeds is a real run.
"""

import asyncio
import http.server
import threading
import time

import httpx
import pytest

import kennel
from conftest import _free_port


class Gate:
    """A local HTTP server that answers the first ``refusals`` requests with ``status`` (and
    ``Retry-After: retry_after`` when given), and forwards the rest to ``upstream``."""

    def __init__(self, upstream: str, status: int, refusals: int, retry_after=None):
        self.upstream, self.status, self.refusals = upstream, status, refusals
        self.retry_after = retry_after
        self.seen = []
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                gate.seen.append((self.command, self.path))
                if len(gate.seen) <= gate.refusals:
                    self._refuse()
                else:
                    self._forward(body)

            def _refuse(self):
                body = (b'{"error":{"code":"busy","message":"the gate says later"}}')
                self.send_response(gate.status)
                if gate.retry_after is not None:
                    self.send_header("Retry-After", str(gate.retry_after))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self, body):
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "connection")}
                r = httpx.request(self.command, gate.upstream + self.path, headers=headers,
                                  content=body, timeout=60)
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _down_url() -> str:
    """A loopback URL nothing listens at (a port just freed)."""
    return f"http://127.0.0.1:{_free_port()}"


def test_a_down_server_raises_connection_failed_naming_the_url():
    url = _down_url()
    with kennel.Client(url, token="t" * 16) as client:
        with pytest.raises(kennel.ConnectionFailed) as e:
            client.run_code("print(1)")
        assert isinstance(e.value, kennel.KennelError)
        assert isinstance(e.value.__cause__, httpx.ConnectError)
        assert e.value.url == url and e.value.status is None
        assert e.value.code == "connection_failed"
        assert f"cannot connect to the Kennel server at {url}" in str(e.value)
        with pytest.raises(kennel.ConnectionFailed):
            client.stream_code("print(1)")


def test_a_down_server_raises_connection_failed_in_the_async_client():
    url = _down_url()

    async def main():
        async with kennel.AsyncClient(url, token="t" * 16) as client:
            with pytest.raises(kennel.ConnectionFailed) as e:
                await client.list_sessions()
            assert e.value.url == url
            with pytest.raises(kennel.ConnectionFailed):
                await client.stream_code("print(1)")

    asyncio.run(main())


def test_a_server_that_stops_mid_stream_raises_connection_lost(server):
    # A gate that forwards nothing: it closes the connection after the stream's head.
    class Cut(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"event: stdout\n")
            self.wfile.flush()
            self.close_connection = True

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Cut)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        with kennel.Client(url, token="t" * 16) as client:
            stream = client.stream_code("print(1)")
            with pytest.raises(kennel.ConnectionLost) as e:
                list(stream)
            assert e.value.url == url
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_429_then_success_is_retried_after_retry_after(server):
    with Gate(server.url, 429, refusals=1, retry_after=1) as gate:
        with kennel.Client(gate.url, token=server.token, timeout=60) as client:
            started = time.monotonic()
            r = client.run_code("print(6*7)")
            waited = time.monotonic() - started
    assert r.stdout == "42\n"
    assert [m for m, _ in gate.seen] == ["POST", "POST"]
    assert waited >= 1.0, "the retry came before the server's Retry-After"


def test_a_429_then_success_is_retried_for_a_stream_and_a_session(server):
    with Gate(server.url, 429, refusals=1, retry_after=0) as gate:
        with kennel.Client(gate.url, token=server.token, timeout=60) as client:
            with client.stream_code("print(1)") as stream:
                assert stream.result.stdout == "1\n"
            with Gate(server.url, 429, refusals=2) as second:
                # No Retry-After: the client backs off on its own (0.5 s, then 1 s).
                c2 = kennel.Client(second.url, token=server.token, timeout=60)
                with c2.session() as s:
                    assert s.run_code("print(2)").stdout == "2\n"
                c2.close()
    assert len(gate.seen) == 2
    assert [p for _, p in second.seen[:3]] == ["/v1/sessions"] * 3


def test_a_503_with_retry_after_is_retried_in_the_async_client(server):
    async def main(url):
        async with kennel.AsyncClient(url, token=server.token, timeout=60) as client:
            r = await client.run_code("print(3)")
            stream = await client.stream_code("print(4)")
            return r, await stream.wait()

    with Gate(server.url, 503, refusals=1, retry_after=0) as gate:
        r, streamed = asyncio.run(main(gate.url))
    assert r.stdout == "3\n" and streamed.stdout == "4\n"
    assert len(gate.seen) == 3


def test_retries_are_bounded_then_busy_is_raised(server):
    with Gate(server.url, 429, refusals=100, retry_after=0) as gate:
        with kennel.Client(gate.url, token=server.token, retries=2) as client:
            with pytest.raises(kennel.Busy) as e:
                client.run_code("print(1)")
    assert e.value.status == 429 and e.value.retry_after == 0.0
    assert len(gate.seen) == 3, "one request and two retries"


def test_a_retry_after_beyond_the_bound_is_not_waited_for(server):
    with Gate(server.url, 429, refusals=1, retry_after=3600) as gate:
        with kennel.Client(gate.url, token=server.token) as client:
            with pytest.raises(kennel.Busy) as e:
                client.run_code("print(1)")
    assert e.value.retry_after == 3600.0
    assert len(gate.seen) == 1


def test_a_503_without_retry_after_is_not_retried(server):
    with Gate(server.url, 503, refusals=1) as gate:
        with kennel.Client(gate.url, token=server.token) as client:
            with pytest.raises(kennel.KennelError) as e:
                client.run_code("print(1)")
    assert e.value.status == 503
    assert len(gate.seen) == 1
