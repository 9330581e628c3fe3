//! The dummy interface `edge-dummy0` that carries the MetaServer's `dummyServer` address
//! (KubeEdge v1.17): pods on any network reach the host there, as they would reach the
//! apiserver's service address. Made with iproute2 (arguments, never a shell); idempotent.
//! (Left in place on exit, as KubeEdge leaves it: pods keep their address across restarts.)

use std::net::IpAddr;
use std::process::Command;

pub const LINK: &str = "edge-dummy0";

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        format!(
            "running `ip {}`: {e} (is iproute2 installed?)",
            args.join(" ")
        )
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// Creates `edge-dummy0` (if missing) with `addr` and brings it up. A kernel without the
/// dummy driver gets the address on `lo` instead: as reachable from pods and the host.
pub fn ensure(addr: IpAddr) -> Result<(), String> {
    ensure_on(LINK, addr)
}

/// Like [`ensure`], for the dummy interface `link` (edgemesh's `edgemesh0`).
pub fn ensure_on(link: &str, addr: IpAddr) -> Result<(), String> {
    let prefix = if addr.is_ipv4() { 32 } else { 128 };
    let cidr = format!("{addr}/{prefix}");
    match ip(&["link", "add", link, "type", "dummy"]) {
        Ok(()) => {}
        Err(e) if e.contains("File exists") => {}
        Err(e) if e.contains("Unknown device type") || e.contains("not supported") => {
            tracing::warn!(error = %e, %addr, "no dummy interface driver in this kernel; the address goes on lo");
            return ip(&["addr", "replace", &cidr, "dev", "lo"]);
        }
        Err(e) => return Err(e),
    }
    ip(&["addr", "replace", &cidr, "dev", link])?;
    ip(&["link", "set", link, "up"])
}

/// Removes `addr` from `link` (or `lo`) and deletes the dummy `link` (`edgecore reset`).
pub fn remove(link: &str, addr: IpAddr) {
    let prefix = if addr.is_ipv4() { 32 } else { 128 };
    let cidr = format!("{addr}/{prefix}");
    let _ = ip(&["addr", "del", &cidr, "dev", "lo"]);
    let _ = ip(&["link", "delete", link]);
}
