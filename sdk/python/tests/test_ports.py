"""Preview URLs of a session's ports (``session.ports``), against the real server."""

import asyncio
import time

import httpx
import pytest

from kennel import AsyncClient, Client, NotFound


def _get(url, **kw):
    """GETs ``url`` until the app answers (a 502 while it starts), for up to 30 s."""
    deadline = time.monotonic() + 30
    while True:
        r = httpx.get(url, follow_redirects=False, **kw)
        if r.status_code != 502 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def test_a_port_is_opened_listed_reached_and_revoked(client):
    with client.session() as s:
        s.processes.start(cmd="python3 -m http.server 3000 --bind 127.0.0.1")
        preview = s.ports.open(3000, expires_in="1h")
        assert preview.port == 3000
        assert preview.url.endswith(f"/p/{s.id}/3000/?kennel_token={preview.token}")
        assert preview.expires_at_unix_ms > time.time() * 1000
        r = _get(preview.url)
        assert r.status_code == 200, r.text
        assert "Directory listing" in r.text
        assert r.headers["content-security-policy"] == "sandbox allow-scripts allow-forms"
        assert [p.port for p in s.ports.list()] == [3000]
        s.ports.revoke(3000)
        assert _get(preview.url).status_code == 401
        assert s.ports.list() == []
        with pytest.raises(NotFound):
            s.ports.revoke(3000)


def test_async_ports(server):
    async def main():
        async with AsyncClient(server.url, token=server.token) as client:
            async with client.session() as s:
                preview = await s.ports.open(3001)
                assert [p.port for p in await s.ports.list()] == [3001]
                await s.ports.revoke(3001)
                assert await s.ports.list() == []
                return preview
    preview = asyncio.run(main())
    assert preview.token in preview.url
