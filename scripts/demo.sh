#!/usr/bin/env bash
# The local demo: installs what it needs (scripts/setup.sh), then runs e2e's local-demo binary
# (private containerd + local registry, in-memory control plane, cloudcore, edgecore). Ctrl-C
# stops it and removes everything it started. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  -h|--help)
    cat <<'USAGE'
Usage: sudo bash scripts/demo.sh

Runs the local demo: installs the packages it needs (scripts/setup.sh), builds its binaries
(profile bench-fast: optimised without link-time optimisation, 16 codegen units in parallel;
the shipped binaries keep the release profile), then starts an in-memory control plane,
cloudcore, edgecore (node edge-demo) and a private containerd, runs a sample pod and shows kubectl working against it, a Deployment
scaled to 3 on the edge node, then a Modbus device (modbus-sim) served by modbus-mapper with
its reported value, the edge's MetaServer on 127.0.0.1:10550, and the router on
127.0.0.1:9443 with rule `web` (curl http://127.0.0.1:9443/edge-demo/default/web reaches the
web pods through the edge's servicebus). `kill -USR1 <pid>` stops
cloudcore (the edge goes offline, its pods keep running) and starts it again. Ctrl-C stops it
and removes everything it started. The terminal shows the walk-through; the components log to
/tmp/kubeedge-rs-demo-logs/{apiserver,cloudcore,edgecore,demo}.log (under $TMPDIR if set). One demo per machine: a
second one (or the e2e demo test) refuses to start while one runs. Needs root. The README
walks through what to try.
USAGE
    exit 0
    ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/demo.sh needs root (it installs packages and runs containerd). Run it as:" >&2
  echo "    sudo bash scripts/demo.sh" >&2
  exit 1
fi
bash scripts/setup.sh
# bench-fast, not release: fat LTO with one codegen unit takes ~25 minutes on a busy 2-core
# machine (issue 23); bench-fast builds in parallel without LTO. The shipped binaries (build-cloudcore-image.sh) keep release.
echo "[demo] building (profile bench-fast): local-demo, modbus-mapper, modbus-sim..."
cargo build --profile bench-fast -p e2e --bin local-demo -p modbus-mapper --bins
echo "[demo] starting local-demo..."
exec "${CARGO_TARGET_DIR:-target}/bench-fast/local-demo" "$@"
