# A small app for the preview tests, run inside a session's sandbox: `python3 app.py PORT LOG`.
# GET /ws with an Upgrade is a WebSocket that echoes text frames; GET /page is a page whose
# script talks to that WebSocket and, given ?other=URL, tries to fetch another URL; anything
# else answers its own request as JSON (method, path, headers) and sets a cookie; GET /wait
# answers that way too, once a WebSocket has echoed (or after 30 s). Each
# request's path is appended to LOG.
import asyncio, base64, hashlib, json, struct, sys

PORT, LOG = int(sys.argv[1]), sys.argv[2]
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
ECHOED = None  # an asyncio.Event, made in the server's loop

PAGE = """<!doctype html><html><body><pre id="out">pending</pre><script>
const results = [];
function done() { document.getElementById('out').textContent = btoa(JSON.stringify(results)); }
const other = new URLSearchParams(location.search).get('other');
if (other) {
  const x = new XMLHttpRequest();
  try { x.open('GET', other, false); x.send(); results.push({name: 'other', status: x.status}); }
  catch (e) { results.push({name: 'other', error: e.name}); }
}
const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + location.pathname.replace(/page$/, 'ws'));
// The fetch of `wait` is answered once the echo has gone: a pending fetch holds chromium's
// virtual time, which an open WebSocket does not, so the page is not dumped before the echo.
ws.onopen = () => { ws.send('ping from the page'); fetch(location.pathname.replace(/page$/, 'wait')); };
ws.onmessage = (m) => { results.push({name: 'ws', data: m.data}); ws.close(); done(); };
ws.onerror = () => { results.push({name: 'ws', error: 'error'}); done(); };
</script></body></html>"""


async def handle(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except Exception:
        writer.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    with open(LOG, "a") as f:
        f.write(target + "\n")
    path = target.split("?", 1)[0]
    if path.endswith("/ws") and headers.get("upgrade", "").lower() == "websocket":
        accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + GUID).digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        await writer.drain()
        while True:
            b0, b1 = await reader.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", await reader.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", await reader.readexactly(8))[0]
            mask = await reader.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(await reader.readexactly(n)))
            if b0 & 0x0F == 8:
                writer.write(b"\x88\x00")
                await writer.drain()
                break
            if b0 & 0x0F == 1:
                reply = b"echo: " + data
                writer.write(bytes([0x81, len(reply)]) + reply if len(reply) < 126 else
                             bytes([0x81, 126]) + struct.pack("!H", len(reply)) + reply)
                await writer.drain()
                ECHOED.set()
        writer.close()
        return
    if path.endswith("/wait"):
        try:
            await asyncio.wait_for(ECHOED.wait(), 30)
            await asyncio.sleep(0.2)  # the echo's frame reaches the browser first
        except asyncio.TimeoutError:
            pass
    if path.endswith("/page"):
        body, kind = PAGE.encode(), b"text/html"
    else:
        body = json.dumps({"method": method, "path": target, "headers": headers}).encode()
        kind = b"application/json"
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nSet-Cookie: app=1\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    writer.close()


async def main():
    global ECHOED
    ECHOED = asyncio.Event()
    server = await asyncio.start_server(handle, "127.0.0.1", PORT)
    async with server:
        await server.serve_forever()

asyncio.run(main())
