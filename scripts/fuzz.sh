#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 60), seeded from
# fixtures/ and the example configs, and prints executions and crashes per
# target. Needs cargo-fuzz (`cargo install cargo-fuzz`); the installed stable
# toolchain builds it with RUSTC_BOOTSTRAP=1 (cargo-fuzz passes -Z flags).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Crashes land in fuzz/artifacts/<target>/; a fixed one is copied to
# fixtures/fuzz-regressions/<target>/, which `cargo test --test
# fuzz_regressions` replays. No sanitizer: the crate has no unsafe code, and
# libFuzzer runs several times faster without ASan. Debug assertions are on,
# so an arithmetic overflow is a crash.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(frame_decoder headers message decline config pcap mask service)
fi
if ! command -v cargo-fuzz >/dev/null; then
    echo "fuzz.sh: cargo-fuzz is missing: cargo install cargo-fuzz" >&2
    exit 1
fi
export RUSTC_BOOTSTRAP=1
python3 scripts/fuzz_seeds.py
(cd fuzz && cargo fuzz build -s none -a)

status=0
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    log="fuzz/artifacts/$t.log"
    # -jobs/-workers stay at 1: the machine is shared.
    if (cd fuzz && cargo fuzz run -s none -a "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        >"../$log" 2>&1); then
        result=ok
    else
        result=CRASH
        status=1
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    echo "$t: $result, ${execs:-?} executions in ${secs}s, corpus $(ls "fuzz/corpus/$t" | wc -l) inputs (log: $log)"
done
exit $status
