"""The keystroke-echo anchor of bench/processes.py: each WebSocket connection gets bash on a
host pty, its output sent as binary frames and every frame received written to it, as
Kennel's terminal WebSocket does. PyPI's websockets, no compression. Prints its port, then
serves until it is killed. Usage: pty-bridge.py"""

import asyncio
import os
import pty
import signal

from websockets.asyncio.server import serve

SHELL = ["bash", "--noprofile", "--norc", "-i"]


def read(fd):
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the shell is gone
        return b""


async def bridge(ws):
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(SHELL[0], SHELL, {**os.environ, "TERM": "xterm-256color", "PS1": "$ "})
    out = asyncio.Queue()
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, lambda: out.put_nowait(read(fd)))

    async def pump():
        while data := await out.get():
            await ws.send(data)

    task = asyncio.create_task(pump())
    try:
        async for message in ws:
            os.write(fd, message if isinstance(message, bytes) else message.encode())
    finally:
        loop.remove_reader(fd)
        task.cancel()
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(os.waitpid, pid, 0)
        os.close(fd)


async def main():
    async with serve(bridge, "127.0.0.1", 0, compression=None) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
