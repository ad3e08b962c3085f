#!/usr/bin/env bash
# The test command: installs what the tests need (idempotently), then runs every test suite.
# Run as root on a fresh Debian 12 machine, or as a user once the packages are installed.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

if [ ! -x .venv/bin/pytest ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q -r tests/python/requirements.txt
fi

./scripts/build-test-guest.sh

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --all-targets
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi
VIRTPLUG_BIN="$PWD/target/debug/virtplug" .venv/bin/pytest -q tests/python
./scripts/fuzz-smoke.sh
