#!/usr/bin/env bash
# Builds the release cloudcore and its container image without Docker (the project's own
# deterministic OCI image builder, `build-image cloudcore`). Every option after the script's own
# is passed to build-image; see --help.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
Usage: scripts/build-cloudcore-image.sh [--out FILE] [--tag REF] [--push HOST:PORT/REPO:TAG]
                                        [--label KEY=VALUE]...

Builds target/release/cloudcore (cargo build --release -p cloudcore) and the tool build-image
(debug profile, e2e crate),
then writes the cloudcore image as an OCI image archive (default cloudcore-image.tar, image
name kubeedge-rs/cloudcore:<workspace version>) holding the binary, its loader and shared
libraries, /etc/passwd with user nonroot (65532) and OCI labels (version, revision).

  --out FILE      the archive to write (default cloudcore-image.tar)
  --tag REF       the image name in the archive (default kubeedge-rs/cloudcore:<version>)
  --push REF      also push to a registry over plain HTTP, e.g.
                  localhost:5000/kubeedge-rs/cloudcore:0.1.0
  --label K=V     another image label (repeatable)
  -h, --help      this text

Then, on a containerd node:  ctr -n k8s.io images import cloudcore-image.tar
or to any registry:          skopeo copy oci-archive:cloudcore-image.tar docker://<registry>/kubeedge-rs/cloudcore:<version>
                             (crane: tar -xf the archive into a directory, crane push <dir> <ref>)
USAGE
}

for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
  esac
done
command -v cargo >/dev/null 2>&1 || { echo "ERROR: cargo not found: install the Rust toolchain" >&2; exit 1; }

echo "==> cargo build --release -p cloudcore --bin cloudcore" >&2
cargo build --release -p cloudcore --bin cloudcore
# The builder in the debug profile: the e2e crate's dependencies are those the tests build.
echo "==> cargo build -p e2e --bin build-image" >&2
cargo build -p e2e --bin build-image

target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
target_dir=${target_dir:-target}
labels=()
if revision=$(git rev-parse HEAD 2>/dev/null); then
  labels=(--label "org.opencontainers.image.revision=$revision")
fi
exec "$target_dir/debug/build-image" cloudcore --binary "$target_dir/release/cloudcore" "${labels[@]}" "$@"
