#!/usr/bin/env bash
# The project's single test command (CI runs it through .ci/run on a fresh clone):
# machine set-up, formatting, lints, then every test of the workspace. Needs root: it installs
# packages and the end-to-end tests run a private containerd.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test.sh needs root: it installs packages (scripts/setup.sh) and the e2e tests" >&2
  echo "run containerd, mount overlays and create network namespaces. Run it as:" >&2
  echo "    sudo bash scripts/test.sh" >&2
  exit 1
fi
for tool in cargo rustfmt cargo-clippy; do
  command -v "$tool" >/dev/null 2>&1 || { echo "ERROR: $tool not found (install the Rust toolchain with rustfmt and clippy)" >&2; exit 1; }
done

step "machine set-up (scripts/setup.sh)"
bash scripts/setup.sh

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc: the libraries' API documentation builds without a broken link"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p cloudcore -p edgecore -p kubeedge-edged -p kubeedge-shared

step "cargo test --workspace --no-fail-fast"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

step "summary"
# "Running <binary>" / "Doc-tests <crate>" followed by that binary's "test result" line.
grep -E '^\s+(Running|Doc-tests) |^test result:' "$log" | sed -E 's/^\s+//'
if grep -qE '^failures:$' "$log"; then
  echo
  echo "failed tests:"
  grep -E '^    [a-zA-Z0-9_:]+$' "$log" | sort -u
fi
read -r passed failed < <(awk '/^test result:/ {
  for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i }
} END { print p + 0, f + 0 }' "$log")
echo
if [ "$status" -eq 0 ]; then
  echo "ALL TESTS PASSED ($passed passed)"
else
  echo "TESTS FAILED (cargo test exit status $status; $passed passed, $failed failed)"
fi
exit "$status"
