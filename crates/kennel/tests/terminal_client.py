"""A terminal driven as a user's terminal emulator drives it: PyPI's websockets for the
connection, pyte to render the screen. Run by the session suite of each tier
(suites/sessions.rs) as `terminal_client.py BASE SESSION`, with KENNEL_TEST_TOKEN when the
server wants one; it prints `ok   terminal: ...` per check and exits non-zero at the first
failure. `terminal_client.py BASE SESSION bounds` checks instead what the native target checks
on a server with a token and `sessions.max_terminals = 2`."""

import json
import os
import sys
import time

import httpx
import pyte
from websockets.sync.client import connect

BASE, SESSION = sys.argv[1], sys.argv[2]
TOKEN = os.environ.get("KENNEL_TEST_TOKEN")
HEADERS = {"Authorization": f"Bearer {TOKEN}"} if TOKEN else {}
API = httpx.Client(base_url=BASE, headers=HEADERS, timeout=60)
WS = BASE.replace("http://", "ws://", 1) + f"/v1/sessions/{SESSION}"


def ok(what):
    print(f"ok   terminal: {what}", flush=True)


class Term:
    """A WebSocket to a pty with a pyte screen fed by its output, and the text notices."""

    def __init__(self, path, cols=80, rows=24):
        self.ws = connect(WS + path, additional_headers=HEADERS, open_timeout=60)
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.notices = []
        self.closed = None

    def lines(self):
        return [line.rstrip() for line in self.screen.display]

    def pump(self, until, timeout=30):
        """Reads frames until until(self) holds; fails with the screen after timeout."""
        end = time.monotonic() + timeout
        while not until(self):
            left = end - time.monotonic()
            if left <= 0 or self.closed is not None:
                raise AssertionError(f"not seen; screen:\n" + "\n".join(self.lines())
                                     + f"\nnotices: {self.notices}, closed: {self.closed}")
            try:
                frame = self.ws.recv(timeout=min(left, 1))
            except TimeoutError:
                continue
            except Exception as exc:  # the server closed: keep why
                self.closed = exc
                continue
            if isinstance(frame, bytes):
                self.stream.feed(frame)
            else:
                self.notices.append(json.loads(frame))

    def shows(self, line):
        self.pump(lambda t: line in t.lines())

    def control(self, **fields):
        self.ws.send(json.dumps(fields))

    def close(self):
        self.ws.close()


def status(r, expected, what):
    assert r.status_code == expected, f"{what}: {r.status_code} {r.text}"
    return r


def a_terminal_renders_resizes_replays_and_exits():
    opened = status(API.post(f"/v1/sessions/{SESSION}/terminals", json={"cols": 80, "rows": 24}),
                    201, "open").json()
    tid = opened["pid"]
    assert opened["terminal"] and opened["tty"] == {"cols": 80, "rows": 24}, opened
    term = Term(f"/terminals/{tid}")
    term.ws.send(b"echo $((6*7))\n")
    term.shows("42")
    ok("a typed `echo $((6*7))` renders 42 on the screen")
    term.control(type="resize", cols=100, rows=30)
    term.screen.resize(30, 100)
    term.ws.send(b"stty size; echo $TERM; pwd\n")
    term.shows("30 100")
    term.shows("xterm-256color")
    term.shows("/workspace")
    ok("after a resize `stty size` prints the new size; TERM and cwd as documented")
    term.control(type="resize", cols=0, rows=0)
    term.pump(lambda t: any(n["type"] == "error" for n in t.notices))
    refusal = [n for n in term.notices if n["type"] == "error"][0]
    assert refusal["status"] == 400 and "`cols`" in refusal["message"], refusal
    term.ws.send("not json")  # a text frame that is not a control
    term.pump(lambda t: sum(n["type"] == "error" for n in t.notices) == 2)
    term.control(type="input", data="echo still-$((1+1))\n")
    term.shows("still-2")
    ok("a bad control frame gets a 400 notice and the terminal goes on")
    term.close()

    again = Term(f"/terminals/{tid}", cols=100, rows=30)
    again.shows("42")
    ok("a reconnect replays the scrollback")
    again.ws.send(b"exit 3\n")
    again.pump(lambda t: any(n["type"] == "exit" for n in t.notices))
    assert again.notices[-1] == {"type": "exit", "exit_code": 3, "signal": None}, again.notices
    again.pump(lambda t: t.closed is not None)
    assert getattr(again.closed, "rcvd", None) and again.closed.rcvd.code == 1000, again.closed
    listed = status(API.get(f"/v1/sessions/{SESSION}/terminals"), 200, "list").json()
    assert [(t["pid"], t["state"]) for t in listed] == [(tid, "exited")], listed
    ok("`exit` ends the connection with an exit notice and a normal close")


def a_tty_process_and_the_pty_shortcut():
    started = status(API.post(f"/v1/sessions/{SESSION}/processes",
                              json={"cmd": "read x; echo got-$x; stty size", "tty": True,
                                    "cols": 40, "rows": 10}), 201, "start").json()
    pid = started["pid"]
    term = Term(f"/processes/{pid}/pty", cols=40, rows=10)
    term.ws.send(b"hi\n")
    term.shows("got-hi")
    term.shows("10 40")
    term.pump(lambda t: any(n["type"] == "exit" for n in t.notices))
    ok("a `tty: true` process is reached at .../processes/{pid}/pty")
    quick = Term("/pty?cols=60&rows=20", cols=60, rows=20)
    quick.ws.send(b"stty size\n")
    quick.shows("20 60")
    quick.ws.send(b"exit\n")
    quick.pump(lambda t: t.closed is not None)
    ok("GET .../pty opens a terminal and attaches")


def bad_requests_get_their_4xx():
    status(API.get(f"/v1/sessions/{SESSION}/pty"), 426, "a plain GET of a WebSocket")
    tid = status(API.post(f"/v1/sessions/{SESSION}/terminals", json={}), 201, "open").json()["pid"]
    status(API.post(f"/v1/sessions/{SESSION}/terminals/{tid}/resize",
                   json={"cols": 0, "rows": 0}), 400, "a 0x0 resize")
    status(API.post(f"/v1/sessions/{SESSION}/terminals/{tid}/resize",
                   json={"cols": 120, "rows": 40}), 204, "a resize")
    status(API.post(f"/v1/sessions/{SESSION}/terminals", json={"cols": 1001}), 400, "too wide")
    plain = status(API.post(f"/v1/sessions/{SESSION}/processes", json={"argv": ["sleep", "60"]}),
                   201, "start").json()["pid"]
    status(API.post(f"/v1/sessions/{SESSION}/processes/{plain}/resize",
                   json={"cols": 80, "rows": 24}), 400, "resizing a process without a pty")
    status(API.post(f"/v1/sessions/{SESSION}/terminals/{plain}/resize",
                   json={"cols": 80, "rows": 24}), 404, "a process is no terminal")
    status(API.delete(f"/v1/sessions/{SESSION}/terminals/{plain}"), 404, "a process is no terminal")
    for missing in (1, 999999):
        status(API.delete(f"/v1/sessions/{SESSION}/terminals/{missing}"), 404, "no terminal")
    status(API.delete(f"/v1/sessions/{SESSION}/terminals/{tid}"), 204, "close")
    status(API.delete(f"/v1/sessions/{SESSION}/processes/{plain}"), 204, "kill")
    ok("bad input gets its 4xx")


def a_browser_token_and_the_bound():
    """A browser, which cannot set Authorization, offers the token as a subprotocol, which the
    server selects; a wrong one is refused before the upgrade; terminals past the bound get
    429, and a closed one frees its place."""
    from websockets.exceptions import InvalidStatus

    tid = status(API.post(f"/v1/sessions/{SESSION}/terminals", json={}), 201, "open").json()["pid"]
    url = WS + f"/terminals/{tid}"
    with connect(url, subprotocols=[f"kennel.token.{TOKEN}"], open_timeout=60) as ws:
        assert ws.subprotocol == f"kennel.token.{TOKEN}", ws.subprotocol
        ws.send(b"echo $((6*7))\n")
        end, seen = time.monotonic() + 30, b""
        while b"42\r\n" not in seen and time.monotonic() < end:
            frame = ws.recv(timeout=30)
            seen += frame if isinstance(frame, bytes) else b""
        assert b"42\r\n" in seen, seen
    for protocols in ([f"kennel.token.{TOKEN}x"], None):
        try:
            connect(url, subprotocols=protocols, open_timeout=60).close()
            raise AssertionError(f"{protocols}: connected")
        except InvalidStatus as refused:
            assert refused.response.status_code == 401, refused
    ok("the token as the subprotocol kennel.token.<token>; a wrong one or none gets 401")
    second = status(API.post(f"/v1/sessions/{SESSION}/terminals", json={}), 201, "open").json()
    third = API.post(f"/v1/sessions/{SESSION}/terminals", json={})
    status(third, 429, "a terminal past sessions.max_terminals")
    assert "sessions.max_terminals" in third.json()["error"]["message"], third.text
    try:
        connect(WS + "/pty", additional_headers=HEADERS, open_timeout=60).close()
        raise AssertionError("a pty past the bound connected")
    except InvalidStatus as refused:
        assert refused.response.status_code == 429, refused
    status(API.post(f"/v1/sessions/{SESSION}/processes", json={"argv": ["true"]}), 201,
           "processes are counted apart")
    status(API.delete(f"/v1/sessions/{SESSION}/terminals/{second['pid']}"), 204, "close")
    status(API.post(f"/v1/sessions/{SESSION}/terminals", json={}), 201, "a freed place")
    ok("terminals past sessions.max_terminals get 429, processes are counted apart")


def main():
    if sys.argv[3:] == ["bounds"]:
        a_browser_token_and_the_bound()
        return
    a_terminal_renders_resizes_replays_and_exits()
    a_tty_process_and_the_pty_shortcut()
    bad_requests_get_their_4xx()


if __name__ == "__main__":
    main()
