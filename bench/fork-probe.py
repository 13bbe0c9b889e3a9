#!/usr/bin/python3
"""A probe for the fork server issue 19 leaves open: what the kernel allows a child forked from a
warm interpreter, and what it costs. Not a benchmark of Kennel, and no Kennel code runs.

    bench/fork-probe.py [N] [MODULE ...]     (root; default N = 50)

It re-runs itself under `unshare -U -r -m -p -f -n -i -u --mount-proc`, a stand-in for the
zygote's sandbox, and masks /proc there the way Kennel does (a file behind /dev/null, a
directory behind an empty tmpfs, /proc/sys read-only). It imports the MODULEs, then forks N
children in each of three ways. Each child unshares its own mount, uts, ipc, pid and network
namespaces, forks its pid 1, and that pid 1 mounts a private root, a /tmp, a fresh /proc and one
mask on it:
- `same-userns`: the children stay in the zygote's user namespace (the zygote holds
  CAP_SYS_ADMIN there);
- `nested-userns`: each child also makes a user namespace of its own (the zygote needs no
  capability);
- `nested-userns-visible`: the same, with the zygote keeping one unmasked /proc mounted aside.

It prints, per way, the children's exit codes (0: all done; 100 + errno: the /proc mount
failed) and the CPU and wall time per child. Everything happens in namespaces it makes; nothing
on the host changes.
"""
import ctypes
import os
import resource
import subprocess
import sys
import tempfile
import time

libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = (0x20000, 0x4000000, 0x8000000, 0x10000000,
                                                 0x20000000, 0x40000000)
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
MODES = ("same-userns", "nested-userns", "nested-userns-visible")
INSIDE = "--inside"


def mount(src, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s else None  # noqa: E731
    ok = libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) == 0
    return 0 if ok else ctypes.get_errno()


def pid1():
    """The child's pid 1: its own root propagation, /tmp and /proc, and a mask on the /proc."""
    if mount("none", "/", None, MS_REC | MS_PRIVATE) or mount("tmpfs", "/tmp", "tmpfs", 0, "size=16m"):
        os._exit(11)
    err = mount("proc", "/proc", "proc", 0)
    if err:
        os._exit(100 + err)
    if mount("/dev/null", "/proc/kallsyms", None, MS_BIND):
        os._exit(12)
    alone = os.getpid() == 1 and [p for p in os.listdir("/proc") if p.isdigit()] == ["1"]
    os._exit(0 if alone else 13)


def child(mode):
    flags = NEWNS | NEWUTS | NEWIPC | NEWPID | NEWNET
    if mode != "same-userns":
        flags |= NEWUSER
    if libc.unshare(flags) != 0:
        os._exit(10)
    if mode != "same-userns":
        for name, text in (("setgroups", "deny"), ("uid_map", "0 0 1"), ("gid_map", "0 0 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    pid = os.fork()
    if pid == 0:
        pid1()
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))


def cpu_ms():
    r = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(x.ru_utime + x.ru_stime for x in r) * 1000


def probe(mode, n):
    codes = {}
    c0, w0 = cpu_ms(), time.perf_counter()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            child(mode)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        codes[code] = codes.get(code, 0) + 1
    per_cpu, per_wall = (cpu_ms() - c0) / n, (time.perf_counter() - w0) * 1000 / n
    print(f"{mode:<22} exit codes {codes}; {per_cpu:.2f} ms CPU, {per_wall:.2f} ms wall per child")


def inside(n, modules):
    for m in modules:
        __import__(m)
    # Kennel's kinds of /proc masks, made in the zygote's own namespaces.
    assert mount("/dev/null", "/proc/kallsyms", None, MS_BIND) == 0
    assert mount("tmpfs", "/proc/acpi", "tmpfs", MS_RDONLY) == 0
    assert mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC) == 0
    assert mount("none", "/proc/sys", None, MS_BIND | MS_REMOUNT | MS_RDONLY) == 0
    print(f"{n} children per way, after importing {modules or 'nothing'}")
    for mode in MODES:
        if mode != "nested-userns-visible":
            probe(mode, n)
            continue
        aside = tempfile.mkdtemp()  # on the host's /tmp: removed below
        try:
            assert mount("proc", aside, "proc", 0) == 0
            probe(mode, n)
        finally:
            libc.umount2(aside.encode(), 2)  # MNT_DETACH
            os.rmdir(aside)


def main():
    if sys.argv[1:2] == [INSIDE]:
        inside(int(sys.argv[2]), sys.argv[3:])
        return 0
    n = sys.argv[1] if len(sys.argv) > 1 else "50"
    argv = ["unshare", "-U", "-r", "-m", "-p", "-f", "-n", "-i", "-u", "--mount-proc",
            sys.executable, os.path.abspath(__file__), INSIDE, n, *sys.argv[2:]]
    return subprocess.run(argv).returncode


if __name__ == "__main__":
    sys.exit(main())
