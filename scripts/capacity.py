#!/usr/bin/env python3
"""Derives docs/capacity.md's figures from one `scripts/bench.sh` report.

    scripts/capacity.py target/bench-<date>.md

Reads the report's summary block (`key = value` lines) and prints the
capacity tables of docs/capacity.md in Markdown, so that a new bench run
refreshes the doc by pasting. Every figure is arithmetic on four bench lines
(see docs/capacity.md, "Inputs"); the planning assumptions are the constants
below and are stated in the doc.
"""
import re
import sys

# Planning assumptions (docs/capacity.md, "Assumptions").
UTILISATION = 0.5        # plan each core at most half busy at peak
KB_PER_IN_FLIGHT = 2.0   # docs/config.md: about 2 KB per request in flight
NODE_LATENCY_S = 0.3     # a node's (issuer's) answer time, normal day
REQUEST_TIMEOUT_S = 3.0  # timeouts.request default: a stalled node's requests live this long
MAX_IN_FLIGHT = 100_000  # max_in_flight default, per service and instance
LINKS = 6                # node links of one instance: 3 nodes x connections_per_node 2

LOADS = [
    ("seeds' bank, design", 3_000, 2),
    ("seeds' bank, peak", 10_000, 2),
    ("2026 national peak", 144_700, 4),
]


def summary(path):
    values = {}
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^([a-z_0-9.@]+) = (-?[0-9.]+)$", line.strip())
        if m:
            values[m.group(1)] = float(m.group(2))
    return values


def need(values, key):
    if key not in values:
        sys.exit(f"capacity.py: no `{key}` line in the report (run scripts/bench.sh --strace)")
    return values[key]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    v = summary(sys.argv[1])
    c10 = need(v, "cpu_us_per_msg.switch@10000")
    c30 = need(v, "cpu_us_per_msg.switch@30000")
    sys10 = v.get("syscalls_per_msg_perf.switch@10000")
    sat = v.get("saturation_approved_per_s.switch")
    print("| input (bench summary line) | value |")
    print("|---|---:|")
    print(f"| `cpu_us_per_msg.switch@10000` (C10) | {c10:.1f} µs |")
    print(f"| `cpu_us_per_msg.switch@30000` (C30) | {c30:.1f} µs |")
    if sys10 is not None:
        print(f"| `syscalls_per_msg_perf.switch@10000` | {sys10:.2f} |")
    if sat is not None:
        print(f"| `saturation_approved_per_s.switch` | {sat:.0f} msg/s |")
    print()
    print("| load | tx/s | instances (N+1) | per instance at peak, all up / one down | C used | cores busy, whole fleet | cores per instance at ≤ 50%, one down | syscalls/s per instance, one down | in flight per instance, normal / node stalled | memory per instance, node stalled |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---|---:|")
    for name, rate, instances in LOADS:
        per_up = rate / instances
        per_down = rate / (instances - 1)
        c = c10 if per_down <= 20_000 else c30
        busy = rate * c / 1e6
        cores = max(1, -(-per_down * c / 1e6 / UTILISATION // 1))
        sysc = f"{per_down * sys10:,.0f}" if sys10 is not None else "-"
        normal = per_up * NODE_LATENCY_S
        stalled = min(per_down * REQUEST_TIMEOUT_S, MAX_IN_FLIGHT)
        capped = " (max_in_flight)" if per_down * REQUEST_TIMEOUT_S > MAX_IN_FLIGHT else ""
        mem_mb = stalled * KB_PER_IN_FLIGHT / 1000
        print(
            f"| {name} | {rate:,} | {instances} | {per_up:,.0f} / {per_down:,.0f} | "
            f"{'C10' if c == c10 else 'C30'} | {busy:.2f} | {cores:.0f} | {sysc} | "
            f"{normal:,.0f} / {stalled:,.0f}{capped} | {mem_mb:,.0f} MB |"
        )
    per_link = 144_700 / (LOADS[2][2] - 1) / LINKS
    print()
    print(f"National peak, one instance down: {per_link:,.0f} msg/s per node link "
          f"({LINKS} links per instance).")


if __name__ == "__main__":
    main()
