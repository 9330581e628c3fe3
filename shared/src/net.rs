//! Small network facts both binaries need.

use std::net::IpAddr;

/// The address this machine uses to reach other hosts (the default route's source address),
/// or `127.0.0.1` when there is none. No packet is sent: `connect` on UDP only selects the
/// route.
pub fn local_ip() -> IpAddr {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("192.0.2.1:9")?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// `host:port`, with an IPv6 host in brackets (Go's `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_joins_like_go() {
        assert_eq!(join_host_port("10.0.0.1", 10000), "10.0.0.1:10000");
        assert_eq!(join_host_port("fd00::1", 10000), "[fd00::1]:10000");
        assert!(!local_ip().is_unspecified());
    }
}

/// Splits `host:port` (optionally `wss://host:port`, `https://…`, `[v6]:port`, a trailing `/`)
/// into host and port; `None` when it is not one.
pub fn split_server(server: &str) -> Option<(String, u16)> {
    let s = server
        .strip_prefix("wss://")
        .or_else(|| server.strip_prefix("https://"))
        .unwrap_or(server)
        .trim_end_matches('/');
    let (host, port) = s.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().ok()?;
    (!host.is_empty()).then(|| (host.to_string(), port))
}

#[cfg(test)]
mod split_tests {
    use super::split_server;

    #[test]
    fn servers_split_into_host_and_port() {
        assert_eq!(
            split_server("10.0.0.1:10000"),
            Some(("10.0.0.1".into(), 10000))
        );
        assert_eq!(
            split_server("wss://cloud.example:443/"),
            Some(("cloud.example".into(), 443))
        );
        assert_eq!(split_server("[::1]:10000"), Some(("::1".into(), 10000)));
        for bad in ["nocolon", ":10000", "h:notaport", "h:70000", ""] {
            assert_eq!(split_server(bad), None, "{bad}");
        }
    }
}
