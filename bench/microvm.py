#!/usr/bin/env python3
"""Start of the microvm tier, restored from a snapshot and booted cold, next to gVisor's
`runsc run` of the same command.

Interleaved rounds, as ratios, because these machines are shared and noisy:
  - `kennel run --tier microvm -- /bin/echo hi`: spawn to the first byte of output (the guest
    booted, its agent ran the code) and to the exit;
  - `kennel run --tier microvm -- /bin/true` and `-- /usr/bin/python3 -c pass`;
  - the same three booted cold (`KENNEL_VM_SNAPSHOTS=0`);
  - `runsc run` by hand of a minimal bundle with the same two commands (tiers.py's), the anchor;
  - bare `/usr/bin/python3 -c pass`, the floor.
The accelerator (kvm or tcg) is read from a run's result and printed with the figures.
Usage: bench/microvm.sh [--json]   (BENCH_N rounds, default 10)
"""
import json, os, shutil, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import against_baseline, figures_of, fmt, loadavg, summary  # noqa: E402
from tiers import hand_argv, hand_bundle, write_cfg  # noqa: E402

PY = "/usr/bin/python3"
N = int(os.environ.get("BENCH_N", "10"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "1"))


def timed(argv, first_output=False, **kw):
    """(ms to exit, ms to the first byte of stdout or None) of one run, which must exit 0."""
    t = time.perf_counter()
    # stdin is an empty pipe, never the host's /dev/null (see tiers.py).
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, **kw)
    p.stdin.close()
    p.stdin = None
    first = None
    if first_output:
        p.stdout.read(1)
        first = (time.perf_counter() - t) * 1000
    out, err = p.communicate()
    dt = (time.perf_counter() - t) * 1000
    if p.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {p.returncode}: {err.decode()[-400:]}")
    return dt, first


def main():
    kennel = sys.argv[sys.argv.index("--kennel") + 1]
    as_json = "--json" in sys.argv
    vm = [kennel, "run", "--tier", "microvm", "--"]
    probe = subprocess.run(vm[:-1] + ["--json", "--", "/bin/true"], capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"microvm.sh: a microvm run fails here: {probe.stdout}{probe.stderr}")
    iso = json.loads(probe.stdout)["isolation"]
    accel = iso.get("accel")
    runsc = shutil.which("runsc")
    tmp = tempfile.mkdtemp(prefix="kennel-bench-vm-", dir="/run")
    os.chmod(tmp, 0o755)
    bundle = os.path.join(tmp, "bundle")
    os.makedirs(bundle)
    cfg = hand_bundle(bundle)
    state = os.path.join(tmp, "runsc-state")
    # Restored from the snapshot `kennel vm prepare` took, and booted cold (snapshots off).
    cold = ["env", "KENNEL_VM_SNAPSHOTS=0"] + vm
    variants = {
        "vm_echo": (vm + ["/bin/echo", "hi"], True),
        "vm_true": (vm + ["/bin/true"], False),
        "vm_python": (vm + [PY, "-c", "pass"], False),
        "cold_echo": (cold + ["/bin/echo", "hi"], True),
        "cold_true": (cold + ["/bin/true"], False),
        "cold_python": (cold + [PY, "-c", "pass"], False),
        "bare_python": ([PY, "-c", "pass"], False),
    }
    if runsc:
        # As tiers.py runs runsc by hand: ptrace, no network, a minimal bundle.
        variants["runsc_true"] = (hand_argv("runsc", state, bundle, "id"), False)
        variants["runsc_python"] = (hand_argv("runsc", state, bundle, "id"), False)
    samples = {k: [] for k in variants}
    firsts = {k: [] for k, (_, first) in variants.items() if first}
    load_before = loadavg()
    try:
        names = list(variants)
        for rnd in range(WARMUP + N):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                argv, first_output = variants[name]
                if name.startswith("runsc"):
                    write_cfg(bundle, cfg, ["/bin/true"] if name == "runsc_true" else [PY, "-c", "pass"])
                    argv = argv[:-1] + [f"bench-{os.getpid()}-{rnd}-{name}"]
                dt, first = timed(argv, first_output)
                if rnd >= WARMUP:
                    samples[name].append(dt)
                    if first is not None:
                        firsts[name].append(first)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stats = {k: summary(v) for k, v in samples.items()}
    for name, xs in firsts.items():
        stats[name.replace("echo", "first_output")] = summary(xs)
    p50 = {k: (s or {}).get("p50_ms") for k, s in stats.items()}
    ratio = lambda a, b: None if p50.get(a) is None or p50.get(b) is None else p50[a] / p50[b]
    ratios = {
        "vm_true_vs_runsc_true": ratio("vm_true", "runsc_true"),
        "vm_python_vs_runsc_python": ratio("vm_python", "runsc_python"),
        "vm_true_vs_cold_true": ratio("vm_true", "cold_true"),
        "vm_python_vs_cold_python": ratio("vm_python", "cold_python"),
        "cold_true_vs_runsc_true": ratio("cold_true", "runsc_true"),
        "vm_python_vs_bare_python": ratio("vm_python", "bare_python"),
    }
    figures = figures_of(ratios=ratios, extra={f"{k}_p50_ms": (s or {}).get("p50_ms") for k, s in stats.items()})
    if as_json:
        against_baseline("microvm", figures, show=False)
        print(json.dumps({"accel": accel, "rounds": N, "stats": stats, "ratios": ratios,
                          "load_before": load_before, "load_after": loadavg()}, indent=2))
        return
    print(f"accel: {accel} (QEMU {iso.get('runtime', {}).get('version', '?')}); {N} rounds")
    print(f"{'variant':<18}{'p50 ms':>10}{'p99 ms':>10}{'min ms':>10}")
    for k, s in stats.items():
        if s:
            print(f"{k:<18}{fmt(s['p50_ms'], '.1f'):>10}{fmt(s['p99_ms'], '.1f'):>10}{fmt(s['min_ms'], '.1f'):>10}")
    for k, v in ratios.items():
        print(f"RATIO {k} {fmt(v)}")
    print()
    against_baseline("microvm", figures)


if __name__ == "__main__":
    main()
