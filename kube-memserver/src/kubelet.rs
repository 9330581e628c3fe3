//! `pods/<name>/log`: like the real apiserver, the server connects to the node's kubelet endpoint
//! (`status.addresses` + `status.daemonEndpoints.kubeletEndpoint.Port`, default 10250) over TLS,
//! presents its kubelet client certificate (signed by the cluster CA, CN
//! `kube-apiserver-kubelet-client`, O `system:masters`), checks the kubelet's serving
//! certificate against the cluster CA only with [`super::Config::verify_kubelet_certificates`]
//! (`--kubelet-certificate-authority`; upstream's default is not to check, and
//! `insecureSkipTLSVerifyBackend=true` skips the check for one log request), and streams
//! `GET /containerLogs/<ns>/<pod>/<container>` back to the client.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use kubeedge_shared::tls::AnyServerCert;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use serde_json::Value;

use super::handlers::Body;
use super::query::Query;
use super::state::State;
use super::status::{ApiError, ApiResult};
use super::verbs;

/// The TLS client configurations used towards kubelets.
pub struct KubeletTls {
    /// What every request uses: checks the kubelet's certificate against the cluster CA
    /// when the server is configured to, else accepts any.
    pub default: Arc<rustls::ClientConfig>,
    /// `insecureSkipTLSVerifyBackend=true` (pods/log): accepts any certificate.
    pub skip_verify: Arc<rustls::ClientConfig>,
}

/// The kubelet client configurations: `cert`/`key_der` as the client certificate, kubelets'
/// serving certificates checked against `verify_with` (the cluster CA, DER) when given.
pub fn client_configs(
    cert: &CertificateDer<'static>,
    key_der: &[u8],
    verify_with: Option<&[u8]>,
) -> anyhow::Result<KubeletTls> {
    let key = || PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der.to_vec()));
    let (any_cert, provider) = AnyServerCert::new();
    let skip_verify = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(any_cert)
            .with_client_auth_cert(vec![cert.clone()], key())?,
    );
    let default = match verify_with {
        None => skip_verify.clone(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(CertificateDer::from(ca.to_vec()))?;
            Arc::new(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(roots)
                    .with_client_auth_cert(vec![cert.clone()], key())?,
            )
        }
    };
    Ok(KubeletTls {
        default,
        skip_verify,
    })
}

const LOG_PARAMS: &[&str] = &[
    "follow",
    "previous",
    "sinceSeconds",
    "sinceTime",
    "timestamps",
    "tailLines",
    "limitBytes",
];

fn kubelet_address(node: &Value) -> Option<(String, u16)> {
    let addrs = node["status"]["addresses"].as_array()?;
    let host = ["InternalIP", "ExternalIP", "Hostname"]
        .iter()
        .find_map(|t| {
            addrs
                .iter()
                .find(|a| a["type"] == *t)
                .and_then(|a| a["address"].as_str())
        })?;
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .unwrap_or(10250);
    Some((host.to_string(), port))
}

/// The container a `pods/log|exec|attach` request names (or the only one), as the
/// apiserver's `streamLocation` checks it.
pub(super) fn pick_container(pod: &Value, pod_name: &str, query: &Query) -> ApiResult<String> {
    let containers: Vec<&str> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|l| pod["spec"][*l].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    let main: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    match query.non_empty("container") {
        Some(c) if containers.contains(&c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {pod_name}"
        ))),
        None if main.len() == 1 => Ok(main[0].to_string()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {pod_name}, choose one of: [{}]",
            main.join(" ")
        ))),
    }
}

pub(super) type KubeletConn = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A TLS connection to the kubelet of the node `pod` is bound to, and its authority;
/// errors name `verb` and the URL as the apiserver's do.
pub(super) async fn connect(
    st: &State,
    pod: &Value,
    pod_name: &str,
    verb: &str,
    path: &str,
    tls: &Arc<rustls::ClientConfig>,
) -> ApiResult<(KubeletConn, String)> {
    let Some(node_name) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
        return Err(ApiError::bad_request(format!(
            "pod {pod_name} does not have a host assigned"
        )));
    };
    let (host, port) = node_endpoint(st, node_name)?;
    dial(tls, &host, port, verb, path).await
}

/// The host and port of `node_name`'s kubelet, as the apiserver's `GetConnectionInfo` picks
/// them (InternalIP, ExternalIP, Hostname; the reported port, else 10250).
pub(super) fn node_endpoint(st: &State, node_name: &str) -> ApiResult<(String, u16)> {
    let node = verbs::get(st, &st.core("nodes"), "", node_name)?.value();
    kubelet_address(&node).ok_or_else(|| {
        ApiError::internal(format!(
            "node {node_name} has no address to reach its kubelet"
        ))
    })
}

/// A TLS connection to the kubelet at `host:port` made with `tls`, and its authority. The
/// server name checked (with a verifying `tls`) is `host`, as Go's client checks the URL's.
pub(super) async fn dial(
    tls: &Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    verb: &str,
    path: &str,
) -> ApiResult<(KubeletConn, String)> {
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let fail = |e: &dyn std::fmt::Display| {
        ApiError::internal(format!("{verb} https://{authority}{path}: {e}"))
    };
    let tcp = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(&authority),
    )
    .await
    .map_err(|e| fail(&e))?
    .map_err(|e| fail(&e))?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from(host.to_string()).map_err(|e| fail(&e))?;
    let connector = tokio_rustls::TlsConnector::from(tls.clone());
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(server_name, tcp))
        .await
        .map_err(|e| fail(&e))?
        .map_err(|e| fail(&e))?;
    Ok((tls, authority))
}

/// The apiserver's error for a kubelet's non-success answer.
pub(super) fn kubelet_error(status: StatusCode, body: &[u8]) -> ApiError {
    let not_found = status == StatusCode::NOT_FOUND;
    ApiError {
        code: if not_found { 404 } else { 500 },
        reason: if not_found {
            "NotFound"
        } else {
            "InternalError"
        },
        message: String::from_utf8_lossy(body).trim().to_string(),
        details: None,
    }
}

pub async fn pod_log(
    st: &State,
    ns: &str,
    pod_name: &str,
    query: &Query,
    raw_query: &str,
) -> ApiResult<Response<Body>> {
    let pods = st.core("pods");
    let pod = verbs::get(st, &pods, ns, pod_name)?.value();
    let container = pick_container(&pod, pod_name, query)?;
    let passthrough: Vec<&str> = raw_query
        .split('&')
        .filter(|kv| LOG_PARAMS.contains(&kv.split('=').next().unwrap_or_default()))
        .collect();
    let mut path = format!("/containerLogs/{ns}/{pod_name}/{container}");
    if !passthrough.is_empty() {
        path.push('?');
        path.push_str(&passthrough.join("&"));
    }
    let tls = match query.bool("insecureSkipTLSVerifyBackend")? {
        true => &st.kubelet_tls.skip_verify,
        false => &st.kubelet_tls.default,
    };
    let (tls, authority) = connect(st, &pod, pod_name, "Get", &path, tls).await?;
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        ApiError::internal(format!("{what} https://{authority}{path}: {e}"))
    };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| fail("Get", &e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::get(path.as_str())
        .header(http::header::HOST, authority.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail("Get", &e))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| fail("Get", &e))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(kubelet_error(status, &body));
    }
    // An upstream error ends the stream (the client sees the log end), as a proxy would.
    use futures::StreamExt;
    let frames = http_body_util::BodyStream::new(resp.into_body())
        .take_while(|r| futures::future::ready(r.is_ok()))
        .filter_map(|r| futures::future::ready(r.ok().map(Ok::<_, std::convert::Infallible>)));
    let body = BodyExt::boxed(http_body_util::StreamBody::new(frames));
    let mut out = Response::new(body);
    out.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    Ok(out)
}
