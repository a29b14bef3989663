#!/usr/bin/env python3
"""Runs troupe-bench scenarios in fresh processes and prints each figure's distribution.

One run of troupe-bench measures each side once, at one moment of a shared host whose speed
swings by 1.5-2x within minutes (docs/benchmarks.md). A figure read from one run says little;
this prints, per scenario and figure, the minimum, quartiles, median and maximum over N fresh
processes, and with --target how many runs met it.

  scripts/bench-runs.py --runs 10 job_submit
  scripts/bench-runs.py --runs 10 --target ratio=0.6 job_submit
  scripts/bench-runs.py --runs 5 --target troupe_per_s=600000 scope_fanout
  scripts/bench-runs.py --runs 5 --target 'idle_cpu_percent<=1' sched_idle
  scripts/bench-runs.py --runs 5 sequential_await,spawn_await -- --rounds 3
  scripts/bench-runs.py --runs 4 all

Arguments after `--` go to troupe-bench (its --json and --scenario are set here). The binary
is build/bench/troupe-bench unless --bench names another. Needs python3 (a developer's tool:
the README's two commands do not use it).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

# The figures worth a distribution, in the order printed (the others are settings).
FIGURES = [
    "troupe_per_s", "caf_per_s", "ratio", "caf_service_per_s", "ratio_service",
    "caf_sharing_per_s", "caf_stealing_per_s", "caf_1thread_per_s", "caf_troupe_policy_per_s",
    "vs_best_caf", "vs_1thread", "idle_cpu_percent", "wake_median_us", "wake_p99_us",
    "reaped_chunks", "reaped_blocks", "virtual_per_real", "troupe_faults", "troupe_user_ms",
    "troupe_sys_ms", "caf_faults", "caf_user_ms", "caf_sys_ms",
]


def key_of(record):
    # sched_idle prints one line per scheduler: they are three distributions.
    if "scheduler" in record and record.get("scenario") == "sched_idle":
        return record["scenario"] + "/" + record["scheduler"]
    return record.get("scenario", "?")


def quartiles(xs):
    xs = sorted(xs)
    if len(xs) < 4:
        return xs[0], statistics.median(xs), xs[-1]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[1], q[2]


def fmt(x):
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.0f}k"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", help="scenario names, comma-separated (one process runs them "
                                      "all), or `all`: the whole pass, as troupe-bench runs it")
    ap.add_argument("--runs", type=int, default=10, help="fresh processes (default 10)")
    ap.add_argument("--bench", default=None, help="the troupe-bench binary")
    ap.add_argument("--target", action="append", default=[],
                    help="FIGURE=MIN (or FIGURE>=MIN), or FIGURE<=MAX: count the runs "
                         "that meet it (repeatable)")
    ap.add_argument("rest", nargs="*", help="after --: arguments for troupe-bench")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    bench = args.bench or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                       "bench", "troupe-bench")
    if not os.access(bench, os.X_OK):
        ap.error(f"no troupe-bench at {bench} (build it, or name it with --bench)")
    targets = []
    for t in args.target:
        at_most = "<=" in t
        name, sep, value = t.partition("<=" if at_most else "=")
        name = name.rstrip(">")
        try:
            targets.append((name, float(value), at_most))
        except ValueError:
            sep = ""
        if not sep or name not in FIGURES:
            ap.error(f"--target {t}: expected FIGURE=MIN or FIGURE<=MAX with FIGURE one of "
                     f"{', '.join(FIGURES)}")
    values = {}  # scenario key -> figure -> [values]
    for i in range(args.runs):
        cmd = [bench, "--json"] + ([] if args.scenarios == "all" else ["--scenario", args.scenarios])
        cmd += args.rest
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            sys.exit(f"run {i + 1}: troupe-bench exited {done.returncode}")
        for line in done.stdout.splitlines():
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            per = values.setdefault(key_of(rec), {})
            for f in FIGURES:
                if isinstance(rec.get(f), (int, float)):
                    per.setdefault(f, []).append(float(rec[f]))
        sys.stderr.write(f"\rrun {i + 1}/{args.runs}")
        sys.stderr.flush()
    sys.stderr.write("\n")
    for scenario, per in values.items():
        print(f"{scenario} ({args.runs} runs)")
        for f in FIGURES:
            xs = per.get(f)
            if not xs or all(x == 0 for x in xs):
                continue
            q1, med, q3 = quartiles(xs)
            line = (f"  {f:24} min {fmt(min(xs)):>8}  q1 {fmt(q1):>8}  median {fmt(med):>8}  "
                    f"q3 {fmt(q3):>8}  max {fmt(max(xs)):>8}")
            for name, bound, at_most in targets:
                if name == f:
                    met = sum(1 for x in xs if (x <= bound if at_most else x >= bound))
                    line += f"  {'<=' if at_most else '>='} {fmt(bound)}: {met}/{len(xs)}"
            print(line)


if __name__ == "__main__":
    main()
