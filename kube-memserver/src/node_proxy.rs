//! `GET /api/v1/nodes/<name>[:<port>]/proxy/<path>`: like the real apiserver's node proxy,
//! the request goes to the node's kubelet endpoint (`status.addresses` and
//! `daemonEndpoints.kubeletEndpoint.Port`, over TLS with the kubelet client certificate) as
//! `GET /<path>?<query>` with the client's headers (its credentials left out, as the
//! authentication filter removes them) and the reverse-proxy headers apimachinery's proxy
//! `Transport` sets: `X-Forwarded-Uri` (the original path), `X-Forwarded-Host` and
//! `X-Forwarded-Proto`. The kubelet's status, headers and body come back as they are; a
//! kubelet that cannot be reached is a 503 "error trying to reach service". As upstream's
//! `ResourceLocation` (`isProxyableHostname`), a node whose address is (or resolves to)
//! anything but a global unicast address — loopback, link-local, multicast, unspecified,
//! broadcast — is refused with `400 BadRequest` "address not allowed" before any connection;
//! `pods/log`, `exec` and `attach` are not checked, as upstream does not check them.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;

use super::handlers::Body;
use super::kubelet;
use super::query::percent_decode_path;
use super::state::State;
use super::status::{ApiError, ApiResult};

/// `(node, path on the kubelet)` when `path` is a node proxy request.
pub fn target(method: &Method, path: &str) -> Option<(String, String)> {
    if method != Method::GET {
        return None;
    }
    let rest = path.strip_prefix("/api/v1/nodes/")?;
    let (name, rest) = rest.split_once('/')?;
    let sub = rest.strip_prefix("proxy")?;
    if !(sub.is_empty() || sub.starts_with('/')) {
        return None;
    }
    // `<name>:<port>` picks the port; the kubelet's own port is what it reports here.
    let name = percent_decode_path(name.split(':').next().unwrap_or_default());
    if name.is_empty() {
        return None;
    }
    let sub = if sub.is_empty() { "/" } else { sub };
    Some((name, sub.to_string()))
}

/// Headers that belong to one hop, or to the client's credentials.
fn dropped(name: &str) -> bool {
    [
        "authorization",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

pub async fn serve(
    st: &State,
    req: Request<Incoming>,
    node: &str,
    sub: &str,
) -> ApiResult<Response<Body>> {
    let forwarded_uri = req.uri().path().to_string();
    let mut target = sub.to_string();
    if let Some(q) = req.uri().query() {
        target.push('?');
        target.push_str(q);
    }
    let (host, port) = kubelet::node_endpoint(st, node)?;
    check_proxyable(&host).await?;
    let (tls, authority) = kubelet::dial(&st.kubelet_tls.default, &host, port, "Get", &target)
        .await
        .map_err(|e| {
            ApiError::service_unavailable(format!("error trying to reach service: {}", e.message))
        })?;
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::service_unavailable(format!("error trying to reach service: {e}"))
    };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let client_host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut out = Request::get(target.as_str())
        .header(http::header::HOST, authority.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|e| unreachable(&e))?;
    let h = out.headers_mut();
    for (k, v) in req.headers() {
        if !dropped(k.as_str()) {
            h.append(k.clone(), v.clone());
        }
    }
    let set = |h: &mut http::HeaderMap, k: &'static str, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(HeaderName::from_static(k), v);
        }
    };
    set(h, "x-forwarded-uri", &forwarded_uri);
    if !client_host.is_empty() {
        set(h, "x-forwarded-host", &client_host);
    }
    set(h, "x-forwarded-proto", "https");
    let resp = sender
        .send_request(out)
        .await
        .map_err(|e| unreachable(&e))?;
    let status = resp.status();
    let headers = resp.headers().clone();
    // An upstream error ends the body, as a proxy would.
    use futures::StreamExt;
    let frames = http_body_util::BodyStream::new(resp.into_body())
        .take_while(|r| futures::future::ready(r.is_ok()))
        .filter_map(|r| futures::future::ready(r.ok().map(Ok::<_, std::convert::Infallible>)));
    let mut r = Response::new(BodyExt::boxed(http_body_util::StreamBody::new(frames)));
    *r.status_mut() = if status == StatusCode::SWITCHING_PROTOCOLS {
        StatusCode::BAD_GATEWAY
    } else {
        status
    };
    for (k, v) in &headers {
        if !dropped(k.as_str()) {
            r.headers_mut().append(k.clone(), v.clone());
        }
    }
    Ok(r)
}

/// Go's `net.IP.IsGlobalUnicast` (IPv4-mapped IPv6 addresses as their IPv4 address).
fn is_global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_broadcast()
                || v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local())
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_global_unicast(IpAddr::V4(v4)),
            None => {
                !(v6.is_unspecified()
                    || v6.is_loopback()
                    || v6.is_multicast()
                    || v6.is_unicast_link_local())
            }
        },
    }
}

/// Upstream's `isProxyableHostname`: the host (an IP, or a name looked up) must only have
/// global unicast addresses; otherwise `400 BadRequest`, with upstream's messages.
async fn check_proxyable(host: &str) -> ApiResult<()> {
    let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => {
            let looked_up =
                tokio::time::timeout(Duration::from_secs(5), tokio::net::lookup_host((host, 0)))
                    .await
                    .map_err(|_| ApiError::bad_request(format!("lookup {host}: i/o timeout")))?
                    .map_err(|e| ApiError::bad_request(format!("lookup {host}: {e}")))?;
            looked_up.map(|a| a.ip()).collect()
        }
    };
    if addrs.is_empty() {
        return Err(ApiError::bad_request("no addresses for hostname"));
    }
    if addrs.iter().all(|ip| is_global_unicast(*ip)) {
        Ok(())
    } else {
        Err(ApiError::bad_request("address not allowed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_global_unicast_addresses_are_proxyable_as_in_go() {
        for ok in [
            "10.254.254.1",
            "192.0.2.2",
            "8.8.8.8",
            "fd00::2",
            "2001:db8::1",
        ] {
            assert!(is_global_unicast(ok.parse().unwrap()), "{ok}");
        }
        for refused in [
            "127.0.0.1",
            "127.1.2.3",
            "169.254.169.254",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!is_global_unicast(refused.parse().unwrap()), "{refused}");
        }
    }

    #[tokio::test]
    async fn loopback_and_link_local_nodes_are_refused_with_upstreams_status() {
        for host in ["127.0.0.1", "169.254.1.1", "::1", "localhost"] {
            let e = check_proxyable(host).await.unwrap_err();
            assert_eq!(
                (e.code, e.reason, e.message.as_str()),
                (400, "BadRequest", "address not allowed"),
                "{host}"
            );
        }
        assert!(check_proxyable("10.254.254.1").await.is_ok());
        let e = check_proxyable("no-such-host.invalid").await.unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message.starts_with("lookup no-such-host.invalid"),
            "{}",
            e.message
        );
    }

    #[test]
    fn node_proxy_paths() {
        let get = Method::GET;
        assert_eq!(
            target(&get, "/api/v1/nodes/edge-1/proxy/stats/summary"),
            Some(("edge-1".into(), "/stats/summary".into()))
        );
        assert_eq!(
            target(&get, "/api/v1/nodes/edge-1:10250/proxy"),
            Some(("edge-1".into(), "/".into()))
        );
        assert_eq!(target(&get, "/api/v1/nodes/edge-1/proxyx"), None);
        assert_eq!(target(&get, "/api/v1/nodes/edge-1"), None);
        assert_eq!(target(&get, "/api/v1/nodes/edge-1/status"), None);
        assert_eq!(target(&Method::DELETE, "/api/v1/nodes/e/proxy/x"), None);
    }
}
