#!/usr/bin/env bash
# The test command: installs what the tests need (idempotently), then runs every test suite.
# Run as root on a fresh Debian 12 machine, or as a user once the packages are installed.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

# The venv follows tests/python/requirements.txt: reinstalled from it when it changed.
req_stamp=$(sha256sum tests/python/requirements.txt | cut -c1-16)
if [ ! -x .venv/bin/pytest ] || [ "$(cat .venv/requirements.stamp 2>/dev/null)" != "$req_stamp" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q -r tests/python/requirements.txt
  echo "$req_stamp" > .venv/requirements.stamp
fi

./scripts/build-test-guest.sh

cargo fmt --all --check
# The fuzz crate is outside the workspace: its targets are checked on their own.
rustfmt --edition 2021 --config-path rustfmt.toml --check fuzz/fuzz_targets/*.rs
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --all-targets
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi
# -rP: the Redfish validators' pass/warn/fail counts (their tests print them) show in the summary.
VIRTPLUG_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/virtplug" .venv/bin/pytest -q -rP tests/python
./scripts/fuzz-smoke.sh
