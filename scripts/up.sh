#!/usr/bin/env bash
# The run command: installs what virtplug needs (idempotently), builds it, and runs
# `virtplug up` on the embedded default. Extra arguments go to `virtplug up`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# The demo guest the README's quickstart boots (Debian kernel + busybox initramfs; cached).
./scripts/build-test-guest.sh
cargo build --release -p virtplug
exec ./target/release/virtplug up "$@"
