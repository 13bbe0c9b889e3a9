"""A session's file watches, in the agent (see agent.py's ``watch``, ``watch_read`` and
``unwatch`` requests). The agent carries this source as a string and compiles it on the first
request that needs it.

A watch is an inotify instance on a directory under /workspace or /tmp (and, when recursive,
on every directory below it, those made later included). The agent reads it whenever it polls
and keeps what it saw as events in a ring of the last ``RING_MAX``, each numbered: a client
reads from the number it has reached. ``create``, ``modify``, ``delete`` and ``rename`` (a
move within the watched tree; a move out of it is a ``delete``, into it a ``create``); a run
of ``modify`` events of one file is one; events the kernel or the ring dropped are counted
and said by an ``overflow`` event in their place. A directory made under a recursive watch is
watched once the agent has read its creation: what is made in it before then is not seen (as
with any inotify watcher).
"""

import ctypes
import errno
import os
import struct
import time

RING_MAX = 4096  # events kept per watch, the last ones
MOVE_WAIT = 0.1  # seconds a move-from waits for its move-to before it counts as a delete
HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len
IN_MODIFY = 0x2
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_EXCL_UNLINK = 0x4000000
IN_ISDIR = 0x40000000
MASK = (IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ONLYDIR
        | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

_LIBC = None


def libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def checked(ret):
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


class Watch:
    """One inotify instance and the events it has seen."""

    def __init__(self, wid, path, recursive):
        self.wid = wid
        self.root = path
        self.recursive = recursive
        self.fd = checked(libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        self.dirs = {}  # watch descriptor -> directory
        self.events = []  # the ring: (number, event)
        self.next = 0  # the number the next event gets
        self.lost = 0  # events dropped since the last one kept, said by an overflow event
        # Move-froms waiting for their move-to (a read may end between the two): cookie ->
        # (path, is_dir, when seen).
        self.moved = {}
        try:
            self.add_tree(path)
        except BaseException:
            os.close(self.fd)
            raise

    def add_tree(self, path):
        self.add(path)
        if self.recursive:
            for top, dirs, _ in os.walk(path, followlinks=False):
                for name in dirs:
                    self.add(os.path.join(top, name))

    def add(self, path):
        wd = libc().inotify_add_watch(self.fd, os.fsencode(path), MASK)
        if wd < 0 and path == self.root:
            checked(wd)
        if wd >= 0:
            self.dirs[wd] = path

    def keep(self, event):
        if event["type"] == "modify" and self.events:
            last = self.events[-1][1]
            if last["type"] == "modify" and last["path"] == event["path"]:
                return  # a run of writes to one file is one event
        if self.lost:
            self.push({"type": "overflow", "lost": self.lost})
            self.lost = 0
        self.push(event)

    def push(self, event):
        self.events.append((self.next, event))
        self.next += 1
        if len(self.events) > RING_MAX:
            del self.events[0]

    def read_kernel(self):
        """Turns what the kernel has queued into events; a rename is a move-from and a
        move-to of one cookie, which may come in two reads."""
        try:
            data = os.read(self.fd, 256 * 1024)
        except BlockingIOError:
            return
        moved = self.moved
        at = 0
        while at + HEADER.size <= len(data):
            wd, mask, cookie, size = HEADER.unpack_from(data, at)
            raw = data[at + HEADER.size: at + HEADER.size + size].rstrip(b"\0")
            at += HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                self.lost += 1
                continue
            if mask & IN_IGNORED:
                self.dirs.pop(wd, None)
                continue
            parent = self.dirs.get(wd)
            if parent is None or not raw:
                continue
            path = os.path.join(parent, os.fsdecode(raw))
            is_dir = bool(mask & IN_ISDIR)
            if mask & IN_MOVED_FROM:
                moved[cookie] = (path, is_dir, time.monotonic())
                continue
            if mask & IN_MOVED_TO and cookie in moved:
                source, _, _ = moved.pop(cookie)
                self.keep({"type": "rename", "path": source, "to": path, "dir": is_dir})
                self.follow_new_dir(path, is_dir)
                continue
            if mask & (IN_CREATE | IN_MOVED_TO):
                self.keep({"type": "create", "path": path, "dir": is_dir})
                self.follow_new_dir(path, is_dir)
            elif mask & IN_DELETE:
                self.keep({"type": "delete", "path": path, "dir": is_dir})
            elif mask & IN_MODIFY:
                self.keep({"type": "modify", "path": path, "dir": is_dir})

    def settle_moves(self, now, wait=MOVE_WAIT):
        """A move-from whose move-to has not come within ``wait`` left the watched tree."""
        for cookie, (path, is_dir, seen) in list(self.moved.items()):
            if now - seen >= wait:
                del self.moved[cookie]
                self.keep({"type": "delete", "path": path, "dir": is_dir})

    def move_deadline(self):
        return min((seen + MOVE_WAIT for _, _, seen in self.moved.values()), default=None)

    def follow_new_dir(self, path, is_dir):
        if is_dir and self.recursive:
            try:
                self.add_tree(path)
            except OSError:
                pass  # gone again already

    def read(self, start, limit):
        """(events numbered from start, up to limit; the number to read from next; how many
        before start were no longer kept)."""
        first = self.events[0][0] if self.events else self.next
        dropped = max(0, first - start)
        found = [dict(e, seq=n) for n, e in self.events if n >= start][:limit]
        after = found[-1]["seq"] + 1 if found else max(start, first)
        return found, after, dropped

    def close(self):
        os.close(self.fd)


class Watches:
    """A session's watches, by id."""

    def __init__(self, max_watches):
        self.max_watches = max_watches
        self.by_id = {}
        self.next_id = 1

    def start(self, path, recursive):
        if len(self.by_id) >= self.max_watches:
            raise BlockingIOError(errno.EAGAIN, f"{self.max_watches} watches are open already")
        if os.path.realpath(path) != path:
            raise OSError(errno.ELOOP, "is or passes through a symlink; not followed")
        watch = Watch(self.next_id, path, recursive)
        self.by_id[watch.wid] = watch
        self.next_id += 1
        return watch

    def get(self, wid):
        watch = self.by_id.get(wid)
        if watch is None:
            raise ProcessLookupError(errno.ESRCH, f"no watch {wid}")
        return watch

    def stop(self, wid):
        self.get(wid).close()
        del self.by_id[wid]

    def fds(self):
        return [w.fd for w in self.by_id.values()], []

    def on_ready(self, fd):
        for w in self.by_id.values():
            if w.fd == fd:
                w.read_kernel()

    def owns(self, fd):
        return any(w.fd == fd for w in self.by_id.values())

    def check(self, now):
        for w in self.by_id.values():
            w.settle_moves(now)

    def timer(self):
        deadlines = [d for d in (w.move_deadline() for w in self.by_id.values()) if d is not None]
        return min(deadlines, default=None)
