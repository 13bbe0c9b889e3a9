"""Tests of a session's tar transfer (archive.py, loaded by agent.py), over the agent's
JSON-lines protocol.

Run: cd crates/kennel-server/src/agent && /usr/bin/python3 -m unittest test_archive -v
"""

import base64
import io
import os
import tarfile
import unittest

from test_agent import AgentCase, b64


def tar_of(*members, mode="w"):
    """A tar archive of (TarInfo, bytes or None) pairs."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def member(name, kind=tarfile.REGTYPE, mode=0o644, link=""):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


class ArchiveTest(AgentCase):
    def pack(self, path, max_bytes=1 << 20):
        return self.agent.call({"op": "pack", "path": path, "max_bytes": max_bytes})[1]

    def unpack(self, path, data, max_bytes=1 << 20):
        request = {"op": "unpack", "path": path, "b64": b64(data), "max_bytes": max_bytes}
        return self.agent.call(request)[1]

    def test_a_tree_round_trips_with_modes_and_symlinks(self):
        src = self.path("src")
        os.makedirs(os.path.join(src, "sub", "deep"))
        with open(os.path.join(src, "sub", "deep", "a.txt"), "w") as f:
            f.write("alpha")
        with open(os.path.join(src, "run.sh"), "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(os.path.join(src, "run.sh"), 0o755)
        os.symlink("/etc/passwd", os.path.join(src, "link"))
        answer = self.pack(src)
        self.assertEqual(answer["event"], "file", answer)
        data = base64.b64decode(answer["b64"])
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = sorted(tar.getnames())
            self.assertEqual(tar.getmember("link").linkname, "/etc/passwd")
        self.assertEqual(names, ["link", "run.sh", "sub", "sub/deep", "sub/deep/a.txt"])
        dest = self.path("dest")
        answer = self.unpack(dest, data)
        self.assertEqual((answer["event"], answer["size"]), ("ok", 15))
        with open(os.path.join(dest, "sub", "deep", "a.txt")) as f:
            self.assertEqual(f.read(), "alpha")
        self.assertEqual(os.stat(os.path.join(dest, "run.sh")).st_mode & 0o7777, 0o755)
        self.assertEqual(os.readlink(os.path.join(dest, "link")), "/etc/passwd")

    def test_compressed_archives_unpack_and_modes_lose_setuid(self):
        data = tar_of((member("bin/tool", mode=0o4755), b"x"), mode="w:gz")
        self.assertEqual(self.unpack(self.path("d"), data)["event"], "ok")
        self.assertEqual(os.stat(self.path("d", "bin", "tool")).st_mode & 0o7777, 0o755)

    def test_escaping_and_special_members_refuse_the_whole_archive(self):
        cases = {
            "dotdot": member("ok/../../escape.txt"),
            "absolute": member("/tmp/abs.txt"),
            "hardlink": member("h", tarfile.LNKTYPE, link="ok.txt"),
            "device": member("dev", tarfile.CHRTYPE),
            "fifo": member("fifo", tarfile.FIFOTYPE),
        }
        for case, bad in cases.items():
            dest = self.path(f"dest-{case}")
            data = tar_of((member("ok.txt"), b"fine"), (bad, b"" if bad.isreg() else None))
            answer = self.unpack(dest, data)
            self.assertEqual((answer["event"], answer["errno"]), ("error", "EINVAL"), case)
            self.assertFalse(os.path.exists(dest), f"{case}: something was written")
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(self.dir), "escape.txt")))

    def test_nothing_is_written_through_a_symlink(self):
        os.symlink("/", self.path("root-link"))
        data = tar_of((member("root-link/etc/evil"), b"x"))
        answer = self.unpack(self.dir, data)
        self.assertEqual((answer["event"], answer["errno"]), ("error", "ELOOP"), answer)
        # A symlink in the archive itself, then a file under it: refused the same way.
        data = tar_of((member("l", tarfile.SYMTYPE, link="/"), None), (member("l/evil"), b"x"))
        answer = self.unpack(self.path("fresh"), data)
        self.assertEqual(answer["errno"], "ELOOP", answer)
        answer = self.unpack("/workspace/../etc", tar_of((member("a"), b"x")))
        self.assertEqual(answer["errno"], "EINVAL", answer)

    def test_limits_and_garbage(self):
        data = tar_of((member("big"), b"x" * 5000))
        answer = self.unpack(self.path("d"), data, max_bytes=4999)
        self.assertEqual((answer["event"], answer["errno"]), ("error", "EFBIG"))
        self.assertFalse(os.path.exists(self.path("d")))
        answer = self.unpack(self.path("d"), b"not a tar at all" * 64)
        self.assertEqual(answer["errno"], "EINVAL")
        # One line, not tarfile's list of every compression it tried.
        self.assertEqual(answer["message"], "not a tar archive (plain, gzip, bzip2 or xz)")
        # A real archive cut short says what tarfile found wrong with it, on one line.
        cut = tar_of((member("a"), b"x" * 2000))[:1024]
        answer = self.unpack(self.path("d"), cut)
        self.assertEqual(answer["errno"], "EINVAL")
        self.assertEqual(answer["message"], "not a tar archive: unexpected end of data")
        os.makedirs(self.path("full"))
        with open(self.path("full", "f"), "wb") as f:
            f.write(b"y" * 5000)
        answer = self.pack(self.path("full"), max_bytes=4000)
        self.assertEqual((answer["event"], answer["errno"]), ("error", "EFBIG"))
        os.symlink(self.path("full"), self.path("dirlink"))
        self.assertEqual(self.pack(self.path("dirlink"))["errno"], "ELOOP")
        self.assertEqual(self.pack("/etc")["errno"], "EINVAL")


if __name__ == "__main__":
    unittest.main()
