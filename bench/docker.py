#!/usr/bin/python3
"""Start latency of the docker runtime, next to the docker CLI on the same engine.

Normally started by bench/docker.sh, which starts a private Docker Engine (as the tests do)
and sets DOCKER_HOST to it. Measured interleaved in one run, as ratios, because these
machines are shared and noisy:
  - `kennel run --runtime docker -- /bin/true` (and `/usr/bin/python3 -c pass`);
  - the anchor: `docker run --rm --read-only --network none` with the host's /usr, /bin, /lib,
    /lib64 and /etc bound read-only, on the very skeleton image Kennel made (kennel-view:HASH),
    the same commands;
  - `kennel run --runtime runc -- /bin/true`, for reference.
Each figure is perf_counter around subprocess.run, stdout and stderr on /dev/null, stdin an
empty pipe. Usage: bench/docker.sh [--json]   (BENCH_N iterations, default 20)
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import against_baseline, figures_of, fmt, loadavg, print_overheads, print_starts, start_stats  # noqa: E402

PY = "/usr/bin/python3"
PROGRAMS = {"true": ["/bin/true"], "python": [PY, "-c", "pass"]}
BINDS = ["/usr", "/bin", "/lib", "/lib64", "/etc"]

# (name, numerator, denominator): ratios of medians (and of p90s in the JSON). No targets.
RATIOS = [
    ("kennel_docker_true_vs_docker_cli_true", "kennel_docker_true", "docker_cli_true"),
    ("kennel_docker_python_vs_docker_cli_python", "kennel_docker_python", "docker_cli_python"),
    ("kennel_docker_true_vs_kennel_runc_true", "kennel_docker_true", "kennel_runc_true"),
    ("docker_cli_true_vs_kennel_runc_true", "docker_cli_true", "kennel_runc_true"),
]

# (name, minuend, subtrahend): differences of medians in ms.
OVERHEADS = [
    ("kennel_docker_true_minus_docker_cli_true", "kennel_docker_true", "docker_cli_true"),
    ("kennel_docker_python_minus_docker_cli_python", "kennel_docker_python", "docker_cli_python"),
]


def say(*parts):
    print("docker.py:", *parts, file=sys.stderr, flush=True)


def run_once(argv, capture=False):
    """(seconds, exit status, stderr text or None). stdin is an empty pipe, never the host's
    /dev/null, as in bench/tiers.py."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, input=b"", stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE if capture else subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    return dt, p.returncode, (p.stderr.decode(errors="replace").strip() if capture else None)


def view_image(kennel, docker):
    """The skeleton image Kennel runs its containers on: the image of the container a
    `kennel run --runtime docker` has up while it runs (it makes the image first if the engine
    lacks it)."""
    p = subprocess.Popen([kennel, "run", "--runtime", "docker", "--", "/bin/sh", "-c", "sleep 3"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen = None
    try:
        while p.poll() is None and seen is None:
            out = subprocess.run([docker, "ps", "--format", "{{.Image}}"], capture_output=True, text=True)
            seen = next((i for i in out.stdout.split() if i.startswith("kennel-view:")), None)
            time.sleep(0.1)
    finally:
        _, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"docker.py: kennel run --runtime docker failed ({p.returncode}): "
                         f"{err.decode(errors='replace')[-300:]}")
    return seen


def variants(kennel, docker, image):
    cli = [docker, "run", "--rm", "--read-only", "--network", "none"]
    for d in BINDS:
        cli += ["-v", f"{d}:{d}:ro"]
    cli.append(image)
    out = []
    for name, argv in PROGRAMS.items():
        out.append((f"kennel_docker_{name}", [kennel, "run", "--runtime", "docker", "--", *argv]))
        out.append((f"docker_cli_{name}", [*cli, *argv]))
    out.append(("kennel_runc_true", [kennel, "run", "--runtime", "runc", "--", "/bin/true"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env = os.environ.get
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--kennel", default=env("KENNEL"), required=env("KENNEL") is None)
    ap.add_argument("--docker", default="/usr/bin/docker", help="the docker CLI")
    ap.add_argument("-n", type=int, default=int(env("BENCH_N", "20")), help="measured rounds")
    ap.add_argument("--warmup", type=int, default=int(env("BENCH_WARMUP", "2")), help="unrecorded rounds")
    args = ap.parse_args()
    if args.n < 1:
        ap.error("BENCH_N must be at least 1")
    if not env("DOCKER_HOST"):
        say("DOCKER_HOST is not set (bench/docker.sh sets it to its private engine)")
        return 2

    image = view_image(args.kennel, args.docker)
    if image is None:
        say("no kennel-view image seen while `kennel run --runtime docker` ran")
        return 2
    say(f"the skeleton image: {image}")

    active, skipped = [], {}
    for name, argv in variants(args.kennel, args.docker, image):
        # A check (and the first warm-up): a failing run would be timed as a fast start.
        _, rc, err = run_once(argv, capture=True)
        if rc != 0:
            skipped[name] = f"exit status {rc}: {err[-300:] if err else '(no stderr)'}"
            say(f"skipping {name}: {skipped[name]}")
            continue
        active.append((name, argv))
    if not active:
        say("nothing to measure")
        return 2

    load_before = loadavg()
    samples = {name: [] for name, _ in active}
    failures = {name: 0 for name, _ in active}
    for i in range(args.warmup + args.n):
        # Round-robin, the starting variant rotating from round to round.
        for j in range(len(active)):
            name, argv = active[(i + j) % len(active)]
            dt, rc, _ = run_once(argv)
            if i < args.warmup:
                continue
            if rc == 0:
                samples[name].append(dt * 1000.0)
            else:
                failures[name] += 1
    load_after = loadavg()

    stats = start_stats(active, samples, failures, skipped, args.n)
    ratios = {}
    for name, a, b in RATIOS:
        if a in stats and b in stats:
            ratios[name] = {"value": stats[a]["median_ms"] / stats[b]["median_ms"],
                            "p90_value": stats[a]["p90_ms"] / stats[b]["p90_ms"]}
        else:
            ratios[name] = {"value": None, "p90_value": None}
    overheads = {name: (stats[a]["median_ms"] - stats[b]["median_ms"] if a in stats and b in stats else None)
                 for name, a, b in OVERHEADS}

    figures = figures_of(overheads=overheads, ratios=ratios,
                         extra={f"{n}_median_ms": s["median_ms"] for n, s in stats.items()})
    if args.json:
        against_baseline("docker", figures, show=False)
        json.dump({"n": args.n, "warmup": args.warmup, "docker_host": env("DOCKER_HOST"), "image": image,
                   "method": "time.perf_counter around subprocess.run, stdin an empty pipe, stdout and "
                             "stderr to /dev/null, round-robin per iteration",
                   "host": {"nproc": os.cpu_count(), "loadavg_before": load_before,
                            "loadavg_after": load_after, "kernel": os.uname().release},
                   "variants": stats, "skipped": skipped, "ratios": ratios, "overhead_ms": overheads},
                  sys.stdout, indent=2)
        print()
        return 0

    la = lambda l: l[0] if l else "?"  # noqa: E731
    print(f"docker runtime start latency, {args.n} interleaved runs each after {args.warmup} warm-up "
          f"rounds ({os.cpu_count()} CPUs, load {la(load_before)} -> {la(load_after)}; image {image})")
    print_starts([name for name, _ in active], stats, skipped, 21)
    print()
    print_overheads(overheads)
    for name, r in ratios.items():
        print(f"RATIO {name} {fmt(r['value'], '.3f')} (p90s {fmt(r['p90_value'], '.3f')})")
    print()
    against_baseline("docker", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
