//! The address test edge nodes report (`nodeIP`) and cloudcore's stream server listens on in
//! the tests: the apiserver reaches an edge's "kubelet" there. A real kube-apiserver refuses to
//! proxy to loopback and link-local node addresses (`address not allowed`), and so does the
//! in-memory one, so edges get an address this machine owns that is neither: by default
//! 10.254.254.1/32 on the dummy interface `kedummy0` — on `lo` where the kernel has no dummy
//! interfaces (containers) — added once per process with iproute2 (root, CAP_NET_ADMIN) and
//! left in place for the next run; adding it again, also from another process, is harmless.
//! `E2E_NODE_IP` names another non-loopback address of this machine instead (e.g. one a
//! remote apiserver can reach).

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::OnceLock;

/// Names an address of this machine to use instead of [`DEFAULT_NODE_IP`].
pub const NODE_IP_ENV: &str = "E2E_NODE_IP";
/// Private, and unlikely to be in use: kubeadm's pod and service ranges, Docker's and the
/// common CNI ranges are elsewhere.
pub const DEFAULT_NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 254, 254, 1);
/// The dummy interface that carries [`DEFAULT_NODE_IP`].
pub const INTERFACE: &str = "kedummy0";

/// The test node address, added on first use; panics with what to do when that fails (the
/// tests cannot run without it).
pub fn node_ip() -> IpAddr {
    static IP: OnceLock<Result<IpAddr, String>> = OnceLock::new();
    match IP.get_or_init(|| from_env_or_default().map(|a| a.ip)) {
        Ok(ip) => *ip,
        Err(e) => panic!("{e}"),
    }
}

/// An address of this machine for edge nodes, and what adding it created.
#[derive(Debug)]
pub struct NodeAddress {
    pub ip: IpAddr,
    created: Created,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Created {
    Nothing,
    /// The address, on this existing device.
    Address(&'static str),
    /// The dummy interface (with the address).
    Interface,
}

impl NodeAddress {
    /// `E2E_NODE_IP` if set (it must be a non-loopback address of this machine), else
    /// [`DEFAULT_NODE_IP`], added if missing.
    pub fn ensure() -> Result<NodeAddress, String> {
        from_env_or_default()
    }

    /// Removes the address again if [`NodeAddress::ensure`] added it (the demo cleans up; the
    /// tests leave it for the next run).
    pub fn remove_if_added(&self) {
        match self.created {
            Created::Nothing => {}
            Created::Address(dev) => {
                let _ = ip(&["addr", "del", &format!("{}/32", self.ip), "dev", dev]);
            }
            Created::Interface => {
                let _ = ip(&["link", "del", INTERFACE]);
            }
        }
    }
}

fn from_env_or_default() -> Result<NodeAddress, String> {
    match std::env::var(NODE_IP_ENV) {
        Ok(v) if !v.is_empty() => {
            let ip: IpAddr = v
                .parse()
                .map_err(|_| format!("{NODE_IP_ENV}={v:?} is not an IP address"))?;
            if ip.is_loopback() || ip.is_unspecified() || !is_local(ip) {
                return Err(format!(
                    "{NODE_IP_ENV}={ip}: test edges need a non-loopback address of this \
                     machine (one `ip addr` lists)"
                ));
            }
            Ok(NodeAddress {
                ip,
                created: Created::Nothing,
            })
        }
        _ => add(IpAddr::V4(DEFAULT_NODE_IP)),
    }
}

/// Whether `ip` is an address of this machine (something may listen on it).
fn is_local(ip: IpAddr) -> bool {
    std::net::TcpListener::bind((ip, 0)).is_ok()
}

/// Runs `ip <args>`; its stderr on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running `ip` (iproute2; scripts/setup.sh installs it): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Adds `addr`/32 to [`INTERFACE`] (created as a dummy interface), or to `lo` when the kernel
/// has no dummy interfaces; "already exists" answers count as success.
fn add(addr: IpAddr) -> Result<NodeAddress, String> {
    if is_local(addr) {
        return Ok(NodeAddress {
            ip: addr,
            created: Created::Nothing,
        });
    }
    let exists = |e: &str| e.contains("File exists") || e.contains("already assigned");
    let fail = |step: &str, e: String| {
        format!(
            "test edge nodes need a non-loopback address of this machine (a kube-apiserver \
             refuses to proxy to loopback node addresses: \"address not allowed\"), and \
             {step} failed: {e}. Run the tests as root (CAP_NET_ADMIN), or add the address once \
             yourself: `sudo ip link add {INTERFACE} type dummy && sudo ip addr add {addr}/32 \
             dev {INTERFACE} && sudo ip link set {INTERFACE} up` (or `sudo ip addr add \
             {addr}/32 dev lo`), or set {NODE_IP_ENV} to a non-loopback address of this machine"
        )
    };
    let cidr = format!("{addr}/32");
    let (dev, mut created) = match ip(&["link", "add", INTERFACE, "type", "dummy"]) {
        Ok(()) => (INTERFACE, Created::Interface),
        Err(e) if exists(&e) => (INTERFACE, Created::Nothing),
        // No dummy driver (e.g. in a container): loopback carries other addresses as well.
        Err(e) if e.contains("Unknown device type") || e.contains("not supported") => {
            ("lo", Created::Nothing)
        }
        Err(e) => return Err(fail(&format!("`ip link add {INTERFACE} type dummy`"), e)),
    };
    match ip(&["addr", "add", &cidr, "dev", dev]) {
        Ok(()) if created == Created::Nothing => created = Created::Address(dev),
        Ok(()) => {}
        Err(e) if exists(&e) => {}
        Err(e) => return Err(fail(&format!("`ip addr add {cidr} dev {dev}`"), e)),
    }
    ip(&["link", "set", dev, "up"]).map_err(|e| fail(&format!("`ip link set {dev} up`"), e))?;
    if !is_local(addr) {
        return Err(fail(
            &format!("binding {addr} after adding it to {dev}"),
            "not an address of this machine".into(),
        ));
    }
    Ok(NodeAddress { ip: addr, created })
}
