//! What cloudcore asks of the apiserver: every request of its Kubernetes client counted by
//! verb, resource and outcome, with the bytes of bodies both ways — a tower layer around the
//! kube client's HTTP stack. Labels come from fixed sets (`other` for anything else), so a
//! cluster's own resource names never become series.

use http::{Method, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Request labels: the verb as Kubernetes audit logs name it, the resource (with a known
/// subresource) and the outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: &'static str,
    pub resource: &'static str,
    /// `2xx`, `3xx`, `4xx`, `5xx`, or `error` when no answer came.
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    pub verb: &'static str,
    pub resource: &'static str,
}

/// The counters; cheap to clone.
#[derive(Clone, Default)]
pub struct ApiRequestMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub request_bytes: Family<VerbLabels, Counter>,
    pub response_bytes: Family<VerbLabels, Counter>,
}

impl ApiRequestMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("cloudcore_apiserver");
        r.register(
            "requests",
            "Requests to the apiserver by verb (get, list, watch, create, update, patch, delete, deletecollection), resource and outcome",
            self.requests.clone(),
        );
        r.register(
            "request_bytes",
            "Bytes of request bodies sent to the apiserver, by verb and resource",
            self.request_bytes.clone(),
        );
        r.register(
            "response_bytes",
            "Bytes of response bodies received from the apiserver (watch streams as they flow), by verb and resource",
            self.response_bytes.clone(),
        );
    }
}

/// `pods/status` and the like as static strings (label values must be).
fn resource_label(plural: &str, sub: Option<&str>) -> &'static str {
    macro_rules! table {
        ($($p:literal => [$($s:literal),*]),* $(,)?) => {
            match (plural, sub) {
                $( $( ($p, Some($s)) => concat!($p, "/", $s), )* ($p, _) => $p, )*
                _ => "other",
            }
        };
    }
    table!(
        "pods" => ["status", "binding", "eviction"],
        "nodes" => ["status"],
        "configmaps" => [],
        "secrets" => [],
        "services" => [],
        "endpoints" => [],
        "endpointslices" => [],
        "leases" => [],
        "events" => [],
        "namespaces" => [],
        "serviceaccounts" => ["token"],
        "persistentvolumes" => [],
        "persistentvolumeclaims" => [],
        "volumeattachments" => [],
        "certificatesigningrequests" => ["approval", "status"],
        "objectsyncs" => ["status"],
        "clusterobjectsyncs" => ["status"],
        "devices" => ["status"],
        "devicemodels" => [],
        "rules" => ["status"],
        "ruleendpoints" => [],
        "roles" => [],
        "rolebindings" => [],
        "clusterroles" => [],
        "clusterrolebindings" => [],
        "serviceaccountaccesses" => [],
        "subjectaccessreviews" => [],
        "tokenreviews" => [],
    )
}

/// The verb and resource of a request, from its method, path and `watch` parameter.
pub(crate) fn classify(
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> (&'static str, &'static str) {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segs.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return ("get", "discovery"),
    };
    let rest = match rest {
        ["namespaces", _ns, inner @ ..] if !inner.is_empty() => inner,
        other => other,
    };
    let (plural, name, sub) = match rest {
        [] => return ("get", "discovery"),
        [p] => (*p, None, None),
        [p, n] => (*p, Some(*n), None),
        [p, n, s, ..] => (*p, Some(*n), Some(*s)),
    };
    let watch = query.is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1" || kv == "watch")
    });
    let verb = match *method {
        Method::GET if watch => "watch",
        Method::GET if name.is_none() => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if name.is_none() => "deletecollection",
        Method::DELETE => "delete",
        _ => "other",
    };
    // A create on a subresource (serviceaccounts/x/token) names the parent object.
    (verb, resource_label(plural, sub))
}

fn code_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// The layer to put around the kube client's stack.
#[derive(Clone)]
pub struct CountRequests(pub ApiRequestMetrics);

impl<S> tower::Layer<S> for CountRequests {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    metrics: ApiRequestMetrics,
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for Counted<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ReqBody: http_body::Body,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
{
    type Response = Response<CountedBody<ResBody>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (verb, resource) = classify(req.method(), req.uri().path(), req.uri().query());
        let labels = VerbLabels { verb, resource };
        let sent = http_body::Body::size_hint(req.body())
            .exact()
            .unwrap_or_else(|| http_body::Body::size_hint(req.body()).lower());
        if sent > 0 {
            self.metrics
                .request_bytes
                .get_or_create(&labels)
                .inc_by(sent);
        }
        let metrics = self.metrics.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            let code = match &result {
                Ok(resp) => code_class(resp.status()),
                Err(_) => "error",
            };
            metrics
                .requests
                .get_or_create(&RequestLabels {
                    verb,
                    resource,
                    code,
                })
                .inc();
            result.map(|resp| {
                let bytes = metrics.response_bytes.get_or_create(&labels).clone();
                resp.map(|inner| CountedBody { inner, bytes })
            })
        })
    }
}

/// A response body that counts its bytes as they are read.
pub struct CountedBody<B> {
    inner: B,
    bytes: Counter,
}

impl<B> http_body::Body for CountedBody<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.bytes.inc_by(data.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resources cloudcore calls, with the subresources it uses (the label table must know them).
    const RESOURCES: &[(&str, &[&str])] = &[
        ("pods", &["status", "binding", "eviction"]),
        ("nodes", &["status"]),
        ("configmaps", &[]),
        ("secrets", &[]),
        ("services", &[]),
        ("endpoints", &[]),
        ("endpointslices", &[]),
        ("leases", &[]),
        ("events", &[]),
        ("namespaces", &[]),
        ("serviceaccounts", &["token"]),
        ("persistentvolumes", &[]),
        ("persistentvolumeclaims", &[]),
        ("volumeattachments", &[]),
        ("certificatesigningrequests", &["approval", "status"]),
        ("objectsyncs", &["status"]),
        ("clusterobjectsyncs", &["status"]),
        ("devices", &["status"]),
        ("devicemodels", &[]),
        ("rules", &["status"]),
        ("ruleendpoints", &[]),
        ("roles", &[]),
        ("rolebindings", &[]),
        ("clusterroles", &[]),
        ("clusterrolebindings", &[]),
        ("serviceaccountaccesses", &[]),
        ("subjectaccessreviews", &[]),
        ("tokenreviews", &[]),
    ];

    #[test]
    fn requests_are_classified_as_audit_logs_name_them() {
        let cases = [
            (
                Method::GET,
                "/api/v1/pods",
                Some("fieldSelector=spec.nodeName%3De"),
                "list",
                "pods",
            ),
            (
                Method::GET,
                "/api/v1/pods",
                Some("watch=true&resourceVersion=5"),
                "watch",
                "pods",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/configmaps/x",
                None,
                "get",
                "configmaps",
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/pods/p/status",
                None,
                "patch",
                "pods/status",
            ),
            (
                Method::PATCH,
                "/api/v1/nodes/n/status",
                None,
                "patch",
                "nodes/status",
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n",
                None,
                "update",
                "leases",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/ns/serviceaccounts/sa/token",
                None,
                "create",
                "serviceaccounts/token",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/pods/p",
                None,
                "delete",
                "pods",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/pods",
                None,
                "deletecollection",
                "pods",
            ),
            (
                Method::GET,
                "/api/v1/namespaces",
                None,
                "list",
                "namespaces",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/kubeedge",
                None,
                "get",
                "namespaces",
            ),
            (
                Method::GET,
                "/apis/reliablesyncs.kubeedge.io/v1alpha1/objectsyncs",
                Some("watch=1"),
                "watch",
                "objectsyncs",
            ),
            (
                Method::GET,
                "/apis/example.com/v1/widgets",
                None,
                "list",
                "other",
            ),
            (Method::GET, "/version", None, "get", "discovery"),
            (Method::GET, "/apis", None, "get", "discovery"),
        ];
        for (m, path, q, verb, resource) in cases {
            assert_eq!(classify(&m, path, q), (verb, resource), "{m} {path} {q:?}");
        }
    }

    #[test]
    fn every_known_resource_has_a_label() {
        for (plural, subs) in RESOURCES {
            assert_eq!(resource_label(plural, None), *plural);
            for s in *subs {
                assert_eq!(resource_label(plural, Some(s)), format!("{plural}/{s}"));
            }
            assert_eq!(resource_label(plural, Some("unknown")), *plural);
        }
        assert_eq!(resource_label("widgets", None), "other");
    }
}
