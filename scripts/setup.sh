#!/usr/bin/env bash
# Installs what the project's tests and demo need on a Debian 12 machine. Idempotent; run as root.
# Nothing is started here: the test harness (e2e/src/containerd.rs, e2e/src/mosquitto.rs) starts
# containerd, the registry and mosquitto as child processes of the test binary, because these
# machines have no systemd.
set -euo pipefail

PACKAGES=(
  containerd                  # CRI runtime used by the e2e tests and the local demo
  runc                        # OCI runtime containerd's runc v2 shim calls
  containernetworking-plugins # bridge, host-local, portmap CNI plugins in /usr/lib/cni
  iptables                    # needed by the bridge (ipMasq) and portmap plugins
  busybox-static              # /bin/busybox, packed into the locally built busybox image
  docker-registry             # distribution 2.8: local registry the tests push images to
  gcc                         # compiles the static pause binary (e2e/images/pause.c)
  libc6-dev                   # static libc for gcc -static
  iproute2                    # `ip link del` of the test bridge at teardown
  mosquitto                   # MQTT broker: the eventbus's external broker in e2e tests (e2e/src/mosquitto.rs)
)

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
  die "must run as root (try: sudo bash scripts/setup.sh)"
fi
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script supports Debian 12 only"

missing=()
for pkg in "${PACKAGES[@]}"; do
  if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    log "ok       $pkg (already installed)"
  else
    log "missing  $pkg"
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  # Package maintainer scripts must not start services (docker-registry, containerd and mosquitto
  # ship init scripts): policy-rc.d exit code 101 means "action forbidden". It is removed again
  # afterwards unless it existed before.
  policy=/usr/sbin/policy-rc.d
  created_policy=false
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    created_policy=true
  fi
  cleanup_policy() { if [ "$created_policy" = true ]; then rm -f "$policy"; fi; }
  trap cleanup_policy EXIT

  log "apt-get update"
  apt-get update -q || die "apt-get update failed (is the Debian package mirror reachable?)"
  log "apt-get install ${missing[*]}"
  apt-get install -y -q --no-install-recommends "${missing[@]}" \
    || die "apt-get install failed for: ${missing[*]}"
fi

# Check that every tool the harness calls is where it expects it.
need_path() { [ -e "$1" ] || die "$1 not found after install ($2)"; }
need_path /usr/bin/containerd "package containerd"
need_path /usr/bin/ctr "package containerd"
need_path /usr/bin/containerd-shim-runc-v2 "package containerd"
need_path /usr/sbin/runc "package runc"
need_path /usr/lib/cni/bridge "package containernetworking-plugins"
need_path /usr/lib/cni/host-local "package containernetworking-plugins"
need_path /usr/lib/cni/portmap "package containernetworking-plugins"
need_path /bin/busybox "package busybox-static"
need_path /usr/bin/docker-registry "package docker-registry"
need_path /usr/sbin/mosquitto "package mosquitto"
command -v iptables >/dev/null 2>&1 || die "iptables not found after install"
command -v gcc >/dev/null 2>&1 || die "gcc not found after install"

log "containerd $(/usr/bin/containerd --version | awk '{print $3}'), runc $(/usr/sbin/runc --version | awk 'NR==1{print $3}')"
log "done"
