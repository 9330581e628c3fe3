//! The dummy interface `edge-dummy0` that carries the MetaServer's `dummyServer` address
//! (KubeEdge v1.17): pods on any network reach the host there, as they would reach the
//! apiserver's service address. Made with iproute2 (arguments, never a shell); idempotent.

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

/// Creates `edge-dummy0` (if missing) with `addr` and brings it up.
pub fn ensure(addr: IpAddr) -> Result<(), String> {
    if let Err(e) = ip(&["link", "add", LINK, "type", "dummy"])
        && !e.contains("File exists")
    {
        return Err(e);
    }
    let prefix = if addr.is_ipv4() { 32 } else { 128 };
    let cidr = format!("{addr}/{prefix}");
    ip(&["addr", "replace", &cidr, "dev", LINK])?;
    ip(&["link", "set", LINK, "up"])
}
