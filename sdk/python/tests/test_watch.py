"""File watch in a session (``session.watch``), against the real server."""

import asyncio
import itertools

import pytest

from kennel import AsyncClient, BadRequest

_marks = itertools.count()


def _changes(s, watch, dir, cmd):
    """What running ``cmd`` changes under the watch, as (kind, path, to, dir): the events up
    to a mark made after it (a file ``dir`` gets), so that no wait is guessed and an event
    too many shows."""
    mark = f"{dir}/.mark-{next(_marks)}"
    s.run_command(f"{cmd}; : > {mark}")
    seen = []
    for ev in watch:
        if ev.path == mark:
            return seen
        seen.append((ev.kind, ev.path, ev.to, ev.dir))
    raise AssertionError(f"the watch ended before {mark} showed; it saw {seen}")


def test_create_modify_rename_and_delete_show_in_order(client):
    with client.session() as s, s.watch("/workspace") as w:
        assert w.path == "/workspace"
        assert _changes(s, w, "/workspace", "echo one > a.txt") == [
            ("create", "/workspace/a.txt", None, False),
            ("modify", "/workspace/a.txt", None, False),
        ]
        assert _changes(s, w, "/workspace", "echo two >> a.txt") == [
            ("modify", "/workspace/a.txt", None, False),
        ]
        assert _changes(s, w, "/workspace", "mv a.txt b.txt") == [
            ("rename", "/workspace/a.txt", "/workspace/b.txt", False),
        ]
        assert _changes(s, w, "/workspace", "rm b.txt") == [
            ("delete", "/workspace/b.txt", None, False),
        ]


def test_recursive_follows_new_directories_and_flat_does_not(client):
    with client.session() as s:
        with s.watch("/workspace", recursive=True) as w:
            assert _changes(s, w, "/workspace", "mkdir d") == [
                ("create", "/workspace/d", None, True),
            ]
            assert _changes(s, w, "/workspace", "touch d/x") == [
                ("create", "/workspace/d/x", None, False),
            ]
        with s.watch("/tmp", recursive=False) as w:
            assert _changes(s, w, "/tmp", "mkdir /tmp/e && touch /tmp/e/x") == [
                ("create", "/tmp/e", None, True),
            ]


def test_a_watch_outside_workspace_and_tmp_is_refused(client):
    with client.session() as s:
        with pytest.raises(BadRequest):
            s.watch("/etc")


def test_async_watch(server):
    async def go():
        async with AsyncClient(server.url, token=server.token) as client:
            async with client.session() as s:
                async with s.watch("/tmp") as w:
                    await s.run_command("mkdir /tmp/async-dir")
                    ev = await w.__anext__()
                    assert (ev.kind, ev.path, ev.dir) == ("create", "/tmp/async-dir", True)
                w = await s.watch("/workspace", recursive=False)
                await s.run_command("touch /workspace/z")
                ev = await w.__anext__()
                assert (ev.kind, ev.path) == ("create", "/workspace/z")
                await w.aclose()

    asyncio.run(go())
