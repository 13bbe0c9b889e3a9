#!/usr/bin/env python3
"""Start latency per tier, next to each OCI runtime run by hand, and gVisor's cost inside.

Measured interleaved in one run, as ratios, because these machines are shared and noisy:
  - `kennel run --runtime R -- /bin/true` (and `python3 -c pass`) against `R run` by hand of
    the very bundle Kennel runs (written by `kennel bundle`, same seccomp profile, id mapping,
    masks and mounts, pinned to one CPU as Kennel pins it): what Kennel itself adds;
  - the same against `R run` of a minimal hand-made bundle (no seccomp, user namespace or
    masks), and `runsc do /bin/true`: what Kennel's policy costs inside the runtime;
  - a loop of os.stat calls and a pure-CPU loop inside native and inside runsc.
Usage: bench/tiers.sh [--json]   (BENCH_N iterations, default 20)
"""
import json, os, shutil, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import against_baseline, figures_of  # noqa: E402

PY = "/usr/bin/python3"
N = int(os.environ.get("BENCH_N", "20"))
RUNTIMES = [r for r in ("crun", "runc", "runsc") if shutil.which(r)]


def hand_bundle(root):
    """A bundle like Kennel's (read-only system binds, tmpfs scratch) written by hand."""
    rootfs = os.path.join(root, "rootfs")
    os.makedirs(rootfs)
    for d in ("proc", "dev", "tmp", "workspace", "usr", "etc"):
        os.makedirs(os.path.join(rootfs, d))
    for l, t in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
        os.symlink(t, os.path.join(rootfs, l))
    ro = ["rbind", "ro", "nosuid", "nodev"]
    cfg = {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/bin/true"],
                    "env": ["PATH=/usr/bin:/bin"], "cwd": "/workspace", "noNewPrivileges": True},
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "hand",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
            {"destination": "/usr", "type": "bind", "source": "/usr", "options": ro},
            {"destination": "/etc", "type": "bind", "source": "/etc", "options": ro},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["size=256m"]},
            {"destination": "/workspace", "type": "tmpfs", "source": "tmpfs", "options": ["size=256m"]},
        ],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
    }
    return cfg


def write_cfg(bundle, cfg, args):
    cfg["process"]["args"] = args
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(cfg, f)


def timed(argv, **kw):
    t = time.perf_counter()
    # Every stream is a pipe, never the host's /dev/null: a runtime run by hand chowns its
    # stdio to the container's root (crun to the mapped uid, runsc to nobody), host-wide;
    # stdout on /dev/null left it owned by nobody after `runsc run` (the output is dropped).
    r = subprocess.run(argv, input=b"", stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    dt = (time.perf_counter() - t) * 1000
    if r.returncode != 0:
        raise SystemExit(f"tiers.py: {' '.join(argv[:4])}... failed: {r.stderr.decode()[-300:]}")
    return dt


def hand_argv(rt, state, bundle, cid, exact=False):
    # As Kennel drives them here: crun without cgroups (it refuses this hybrid host's), runsc
    # on ptrace with no network; `exact` adds the rest of Kennel's flags (runsc's cgroups left
    # alone, its seccomp profile applied).
    extra = {"runsc": ["--platform=ptrace", "--network=none"],
             "crun": ["--cgroup-manager=disabled"]}.get(rt, [])
    if exact and rt == "runsc":
        extra += ["--ignore-cgroups", "--oci-seccomp"]
    return [rt, "--root", state, *extra, "run", "--bundle", bundle, cid]


def export(kennel, rt, argv, into):
    """Kennel's own bundle for `argv` under `rt` (it has no cgroup of Kennel's around it; runc
    makes its own beneath the benchmark's, and removes it after each run)."""
    subprocess.run([kennel, "bundle", "--out", into, "--runtime", rt, "--", *argv],
                   check=True, stdout=subprocess.PIPE)
    return into


def inside(kennel, opts, code):
    out = subprocess.run([kennel, "run", "--json", *opts, "--", PY, "-c", code],
                         capture_output=True, text=True)
    r = json.loads(out.stdout)
    return float(r["stdout"].strip())


def main():
    kennel = sys.argv[sys.argv.index("--kennel") + 1]
    as_json = "--json" in sys.argv
    work = tempfile.mkdtemp(prefix="kennel-bench-tiers-", dir="/run")
    os.chmod(work, 0o755)  # the user-namespaced runtimes reach their bundles as a mapped id
    state = os.path.join(work, "state")
    samples = {}
    try:
        bundle = os.path.join(work, "bundle")
        os.makedirs(bundle)
        cfg = hand_bundle(bundle)
        programs = {"true": ["/bin/true"], "python": [PY, "-c", "pass"]}
        same = {(rt, name): export(kennel, rt, argv, os.path.join(work, f"{rt}-{name}"))
                for rt in RUNTIMES for name, argv in programs.items()}
        for i in range(N + 2):
            for rt in RUNTIMES:
                for name, argv in programs.items():
                    write_cfg(bundle, cfg, argv)
                    cases = {
                        f"{rt} by hand, {name}": hand_argv(rt, state, bundle, f"bench-{i}"),
                        f"{rt} same bundle, {name}": ["taskset", "-c", "0", *hand_argv(
                            rt, state, same[rt, name], f"same-{i}", exact=True)],
                        f"kennel --runtime {rt}, {name}": [kennel, "run", "--runtime", rt, "--", *argv],
                    }
                    if rt == "runsc" and name == "true":
                        cases["runsc do, true"] = ["runsc", "--root", state, "--platform=ptrace",
                                                   "--network=none", "do", "/bin/true"]
                    for label, argv_ in cases.items():
                        dt = timed(argv_)
                        if i >= 2:  # warm-up rounds are not kept
                            samples.setdefault(label, []).append(dt)
            for name, argv in programs.items():
                dt = timed([kennel, "run", "--", *argv])
                if i >= 2:
                    samples.setdefault(f"kennel native, {name}", []).append(dt)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = []
    for rt in RUNTIMES:
        for name in ("true", "python"):
            k = med[f"kennel --runtime {rt}, {name}"]
            h = med[f"{rt} same bundle, {name}"]
            rows.append((f"kennel --runtime {rt} {name}", k, f"{rt} run, same bundle", h, k / h))
            h = med[f"{rt} by hand, {name}"]
            rows.append((f"kennel --runtime {rt} {name}", k, f"{rt} run, minimal", h, k / h))
    if "runsc do, true" in med:
        rows.append(("runsc run by hand true", med["runsc by hand, true"], "runsc do",
                     med["runsc do, true"], med["runsc by hand, true"] / med["runsc do, true"]))
    # gVisor's cost inside: the same loops in native and in runsc.
    stat = "import os,time\nt=time.perf_counter()\nfor _ in range(20000): os.stat('/usr')\nprint((time.perf_counter()-t)*1000)"
    cpu = "import time\nt=time.perf_counter()\nx=0\nfor i in range(3000000): x+=i*i\nprint((time.perf_counter()-t)*1000)"
    inner = {}
    if "runsc" in RUNTIMES:
        for label, code in (("20000 os.stat calls", stat), ("3M-iteration CPU loop", cpu)):
            nat = statistics.median(inside(kennel, [], code) for _ in range(5))
            gv = statistics.median(inside(kennel, ["--runtime", "runsc"], code) for _ in range(5))
            inner[label] = (nat, gv, gv / nat)
    figures = figures_of(ratios={r[0]: r[4] for r in rows},
                         extra={**{f"{k}_median_ms": v for k, v in med.items()},
                                **{f"inside_ratio_{k}": v[2] for k, v in inner.items()}})
    if as_json:
        against_baseline("tiers", figures, show=False)
        print(json.dumps({"n": N, "start_ms": med,
                          "ratios": [{"case": r[0], "anchor": r[2], "ratio": r[4]} for r in rows],
                          "inside_gvisor_ms": {k: {"native": v[0], "runsc": v[1], "ratio": v[2]} for k, v in inner.items()}},
                         indent=2))
        return
    print(f"start latency, median of {N} interleaved runs (target: Kennel adds <= 5% to a runtime)")
    for case, k, anchor, h, ratio in rows:
        print(f"  {case:<30} {k:8.1f} ms   {anchor:<22} {h:8.1f} ms   ratio {ratio:5.2f}")
    for name in ("true", "python"):
        print(f"  kennel native {name:<20} {med[f'kennel native, {name}']:8.1f} ms")
    for label, (nat, gv, ratio) in inner.items():
        print(f"inside gVisor, {label}: native {nat:.1f} ms, runsc {gv:.1f} ms, {ratio:.1f}x slower")
    print()
    against_baseline("tiers", figures)


if __name__ == "__main__":
    main()
