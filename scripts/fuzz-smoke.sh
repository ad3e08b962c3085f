#!/usr/bin/env bash
# The fuzz smoke of CI: builds every cargo-fuzz target (fuzz/; target dir cached in
# ~/.cache/virtplug/fuzz-target, or $VIRTPLUG_FUZZ_TARGET_DIR)
# and runs each on its committed corpus (fuzz/corpus/TARGET) plus a few seconds of new inputs,
# at most 60 s of runs for all targets together (the build not counted: ~4 min from scratch).
# A crash, panic, timeout or out-of-memory fails the script and leaves the input in
# fuzz/artifacts/TARGET/; reproduce it with
#   cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none TARGET artifacts/TARGET/crash-...
# Long runs (>= 10 min per target) are described in the README's Fuzzing section.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain take them. No
# sanitizer: the targets are safe Rust, and libFuzzer still catches panics, timeouts and memory.
export RUSTC_BOOTSTRAP=1
# The instrumented build is the expensive part (~4 min from scratch): it is cached outside the
# checkout, so a fresh clone (CI) reuses it.
target_dir=${VIRTPLUG_FUZZ_TARGET_DIR:-$HOME/.cache/virtplug/fuzz-target}
mkdir -p "$target_dir"
cargo fuzz build -s none --target-dir "$target_dir"

# target:dictionary. 7 targets x 6 s of fuzzing, plus cargo's checks and the corpus replays, stay under 60 s.
TARGETS="api_body:json api_patch:json api_query:query qemu_cmdline:json mountinfo:mountinfo qmp_reply:qmp stored_object:json"
SECONDS_EACH=6
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# What a target leaves in the temp dir (qmp_reply's socket dir lives in a static, which is never
# dropped) goes with the scratch dir.
mkdir -p "$scratch/tmp"
for entry in $TARGETS; do
  target=${entry%%:*}
  dict=${entry##*:}
  mkdir -p "$scratch/$target" "artifacts/$target"
  echo "fuzz-smoke: $target ($(ls "corpus/$target" | wc -l) corpus inputs + ${SECONDS_EACH}s)"
  # New inputs go to the scratch dir: the committed corpus is only read.
  if ! TMPDIR="$scratch/tmp" cargo fuzz run -s none --target-dir "$target_dir" "$target" "$scratch/$target" "corpus/$target" -- \
    -dict="dict/$dict.dict" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    >"$scratch/$target.log" 2>&1; then
    tail -n 60 "$scratch/$target.log" >&2
    echo "fuzz-smoke: $target failed; the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$scratch/$target.log" || true
done
echo "fuzz-smoke: all targets ran clean"
