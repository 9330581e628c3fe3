//! KubeEdge's `rules.kubeedge.io/v1` Rule and RuleEndpoint, and a rule compiled into a
//! [`Route`]: where its messages come from and where they go.
//!
//! The checks are those of KubeEdge's admission webhook (`admit_rule.go`,
//! `admit_ruleendpoint.go`: the allowed source → target pairs, the keys each endpoint type
//! needs, `service_port` on servicebus endpoints), done here because the router must not act
//! on what the webhook would have refused, plus: node names and topics are valid, a rest
//! target is an `http`/`https` URL, a servicebus target port is a number.

use super::path::PathPattern;
use kubeedge_shared::names::valid_node_name;
use kubeedge_shared::topic::{valid_filter, valid_topic};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// `(namespace, name)`.
pub type ObjKey = (String, String);

/// A Rule's spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RuleSpec {
    pub source: String,
    pub source_resource: BTreeMap<String, String>,
    pub target: String,
    pub target_resource: BTreeMap<String, String>,
}

/// A RuleEndpoint's spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RuleEndpointSpec {
    pub rule_endpoint_type: String,
    pub properties: BTreeMap<String, String>,
}

/// A Rule as the router keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `metadata.creationTimestamp` (RFC 3339): the older of two conflicting rules wins.
    pub created: String,
    pub spec: RuleSpec,
}

impl Rule {
    pub fn key(&self) -> ObjKey {
        (self.namespace.clone(), self.name.clone())
    }

    /// From the object the apiserver returned; `None` without a name.
    pub fn from_object(o: &serde_json::Value) -> Option<Rule> {
        let meta = o.get("metadata")?;
        let text = |k: &str| meta.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        let name = text("name");
        if name.is_empty() {
            return None;
        }
        Some(Rule {
            namespace: text("namespace").to_string(),
            name: name.to_string(),
            uid: text("uid").to_string(),
            created: text("creationTimestamp").to_string(),
            spec: o
                .get("spec")
                .cloned()
                .and_then(|s| serde_json::from_value(s).ok())
                .unwrap_or_default(),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointType {
    Rest,
    EventBus,
    ServiceBus,
}

impl EndpointType {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "rest" => Some(Self::Rest),
            "eventbus" => Some(Self::EventBus),
            "servicebus" => Some(Self::ServiceBus),
            _ => None,
        }
    }
}

/// Where a rule's messages come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `http://<router>/<node>/<namespace>/<path>…`. `nodes`: the rule's `node_name` (a
    /// kubeedge-rs extension: comma-separated); `None` takes every node, as KubeEdge does.
    Rest {
        path: PathPattern,
        nodes: Option<BTreeSet<String>>,
    },
    /// MQTT messages of `node` on `topic` (`<namespace>/<topic>`, a filter).
    EventBus { node: String, topic: String },
    /// An application on `node` posting to the servicebus for `target_url`.
    ServiceBus { node: String, target_url: String },
}

/// Where they go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An HTTP server on the edge node: `http://127.0.0.1:<port><path>`.
    ServiceBus { port: u16, path: String },
    /// An MQTT topic at the edge.
    EventBus { topic: String },
    /// A cloud HTTP endpoint (POST).
    Rest { url: http::Uri },
}

/// The rule kinds, a fixed set (metric labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteKind {
    RestToServiceBus,
    RestToEventBus,
    EventBusToRest,
    ServiceBusToRest,
}

impl RouteKind {
    pub fn label(self) -> &'static str {
        match self {
            Self::RestToServiceBus => "rest_servicebus",
            Self::RestToEventBus => "rest_eventbus",
            Self::EventBusToRest => "eventbus_rest",
            Self::ServiceBusToRest => "servicebus_rest",
        }
    }
}

/// A compiled rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub source: Source,
    pub target: Target,
}

impl Route {
    pub fn key(&self) -> ObjKey {
        (self.namespace.clone(), self.name.clone())
    }

    pub fn kind(&self) -> RouteKind {
        match (&self.source, &self.target) {
            (Source::Rest { .. }, Target::EventBus { .. }) => RouteKind::RestToEventBus,
            (Source::EventBus { .. }, _) => RouteKind::EventBusToRest,
            (Source::ServiceBus { .. }, _) => RouteKind::ServiceBusToRest,
            _ => RouteKind::RestToServiceBus,
        }
    }
}

fn need<'a>(m: &'a BTreeMap<String, String>, key: &str, what: &str) -> Result<&'a str, String> {
    m.get(key)
        .map(String::as_str)
        .ok_or_else(|| format!("\"{key}\" property missed in {what}"))
}

fn node(m: &BTreeMap<String, String>, what: &str) -> Result<String, String> {
    let n = need(m, "node_name", what)?;
    if !valid_node_name(n) {
        return Err(format!("node_name {n:?} is not a node name"));
    }
    Ok(n.to_string())
}

/// Compiles `rule` with its endpoints (looked up in its namespace).
pub fn compile(
    rule: &Rule,
    endpoints: &BTreeMap<ObjKey, RuleEndpointSpec>,
) -> Result<Route, String> {
    let endpoint = |name: &str, role: &str| {
        let key = (rule.namespace.clone(), name.to_string());
        let ep = endpoints.get(&key).ok_or_else(|| {
            format!(
                "{role} ruleEndpoint {}/{name} does not exist",
                rule.namespace
            )
        })?;
        let ty = EndpointType::parse(&ep.rule_endpoint_type).ok_or_else(|| {
            format!(
                "{role} ruleEndpoint {}/{name} has unknown type {:?}",
                rule.namespace, ep.rule_endpoint_type
            )
        })?;
        Ok::<_, String>((ty, ep))
    };
    let (source_type, _) = endpoint(&rule.spec.source, "source")?;
    let (target_type, target_ep) = endpoint(&rule.spec.target, "target")?;
    let sr = &rule.spec.source_resource;
    let tr = &rule.spec.target_resource;
    let source = match source_type {
        EndpointType::Rest => {
            let what = "sourceResource when ruleEndpoint is \"rest\"";
            let path = PathPattern::parse(need(sr, "path", what)?)?;
            let nodes = match sr.get("node_name") {
                None => None,
                Some(list) => {
                    let set: BTreeSet<String> = list
                        .split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(str::to_string)
                        .collect();
                    if let Some(bad) = set.iter().find(|n| !valid_node_name(n)) {
                        return Err(format!("node_name {bad:?} is not a node name"));
                    }
                    Some(set)
                }
            };
            Source::Rest { path, nodes }
        }
        EndpointType::EventBus => {
            let what = "sourceResource when ruleEndpoint is \"eventbus\"";
            let sub = need(sr, "topic", what)?;
            let topic = go_path_join(&rule.namespace, sub);
            if !valid_filter(&topic) {
                return Err(format!("topic {topic:?} is not an MQTT topic filter"));
            }
            Source::EventBus {
                node: node(sr, what)?,
                topic,
            }
        }
        EndpointType::ServiceBus => {
            let what = "sourceResource when ruleEndpoint is \"servicebus\"";
            let url = need(sr, "target_url", what)?;
            if url.is_empty() {
                return Err("target_url is empty".into());
            }
            Source::ServiceBus {
                node: node(sr, what)?,
                target_url: url.to_string(),
            }
        }
    };
    let target = match target_type {
        EndpointType::Rest => {
            let what = "targetResource when ruleEndpoint is \"rest\"";
            let url = need(tr, "resource", what)?;
            Target::Rest {
                url: rest_url(url)?,
            }
        }
        EndpointType::EventBus => {
            let topic = need(
                tr,
                "topic",
                "targetResource when ruleEndpoint is \"eventbus\"",
            )?;
            if !valid_topic(topic) {
                return Err(format!("target topic {topic:?} is not an MQTT topic"));
            }
            Target::EventBus {
                topic: topic.to_string(),
            }
        }
        EndpointType::ServiceBus => {
            let path = need(
                tr,
                "path",
                "targetResource when ruleEndpoint is \"servicebus\"",
            )?;
            let port = target_ep.properties.get("service_port").ok_or(
                "\"service_port\" property missed in property when ruleEndpoint is \"servicebus\"",
            )?;
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("service_port {port:?} is not a port"))?;
            let path = if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/{path}")
            };
            kubeedge_shared::servicebus::ServiceCall::parse(&format!("{port}:{path}"))
                .map_err(|e| format!("servicebus target: {e}"))?;
            Target::ServiceBus { port, path }
        }
    };
    let allowed = matches!(
        (source_type, target_type),
        (EndpointType::Rest, EndpointType::EventBus)
            | (EndpointType::Rest, EndpointType::ServiceBus)
            | (EndpointType::EventBus, EndpointType::Rest)
            | (EndpointType::ServiceBus, EndpointType::Rest)
    );
    if !allowed {
        return Err(format!(
            "the rule which is from source ruleEndpoint type {} to target ruleEndpoint type {} is not valid",
            endpoint_name(source_type),
            endpoint_name(target_type)
        ));
    }
    Ok(Route {
        namespace: rule.namespace.clone(),
        name: rule.name.clone(),
        uid: rule.uid.clone(),
        source,
        target,
    })
}

fn endpoint_name(t: EndpointType) -> &'static str {
    match t {
        EndpointType::Rest => "rest",
        EndpointType::EventBus => "eventbus",
        EndpointType::ServiceBus => "servicebus",
    }
}

/// A rest target: an absolute `http` or `https` URL with a host.
pub fn rest_url(s: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = s
        .parse()
        .map_err(|e| format!("rest target {s:?} is not a URL: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(h)) if !h.is_empty() => Ok(uri),
        _ => Err(format!(
            "rest target {s:?} must be an http:// or https:// URL with a host"
        )),
    }
}

/// Go's `path.Join(namespace, topic)`: KubeEdge builds the edge topic (and the router's key)
/// this way, so `//` collapse, `.` and `..` resolve and a trailing `/` goes.
pub fn go_path_join(namespace: &str, topic: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for part in namespace.split('/').chain(topic.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|l| *l != "..") {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            p => out.push(p),
        }
    }
    if out.is_empty() {
        ".".to_string()
    } else {
        out.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(name, type, properties)`.
    type EndpointRow<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    fn endpoints(list: &[EndpointRow]) -> BTreeMap<ObjKey, RuleEndpointSpec> {
        list.iter()
            .map(|(name, ty, props)| {
                (
                    ("default".to_string(), name.to_string()),
                    RuleEndpointSpec {
                        rule_endpoint_type: ty.to_string(),
                        properties: props
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    },
                )
            })
            .collect()
    }

    fn rule(source: &str, sr: &[(&str, &str)], target: &str, tr: &[(&str, &str)]) -> Rule {
        let map = |m: &[(&str, &str)]| {
            m.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Rule {
            namespace: "default".into(),
            name: "r".into(),
            uid: "u".into(),
            created: String::new(),
            spec: RuleSpec {
                source: source.into(),
                source_resource: map(sr),
                target: target.into(),
                target_resource: map(tr),
            },
        }
    }

    fn all_endpoints() -> BTreeMap<ObjKey, RuleEndpointSpec> {
        endpoints(&[
            ("my-rest", "rest", &[]),
            ("my-eventbus", "eventbus", &[]),
            ("my-servicebus", "servicebus", &[("service_port", "8080")]),
        ])
    }

    #[test]
    fn the_four_kinds_compile() {
        let eps = all_endpoints();
        let r = compile(
            &rule(
                "my-rest",
                &[("path", "/a")],
                "my-servicebus",
                &[("path", "/b")],
            ),
            &eps,
        )
        .unwrap();
        assert_eq!(r.kind(), RouteKind::RestToServiceBus);
        assert_eq!(
            r.target,
            Target::ServiceBus {
                port: 8080,
                path: "/b".into()
            }
        );
        let r = compile(
            &rule(
                "my-rest",
                &[("path", "/a")],
                "my-eventbus",
                &[("topic", "t")],
            ),
            &eps,
        )
        .unwrap();
        assert_eq!(r.kind(), RouteKind::RestToEventBus);
        let r = compile(
            &rule(
                "my-eventbus",
                &[("topic", "/sensors//temp/"), ("node_name", "edge-1")],
                "my-rest",
                &[("resource", "http://example.com/in")],
            ),
            &eps,
        )
        .unwrap();
        assert_eq!(
            r.source,
            Source::EventBus {
                node: "edge-1".into(),
                topic: "default/sensors/temp".into()
            }
        );
        let r = compile(
            &rule(
                "my-servicebus",
                &[
                    ("target_url", "http://cloud.example/api"),
                    ("node_name", "edge-1"),
                ],
                "my-rest",
                &[("resource", "https://cloud.example/api")],
            ),
            &eps,
        )
        .unwrap();
        assert_eq!(r.kind(), RouteKind::ServiceBusToRest);
    }

    #[test]
    fn what_kubeedges_webhook_refuses_is_refused() {
        let eps = all_endpoints();
        let cases = [
            rule("my-rest", &[], "my-eventbus", &[("topic", "t")]),
            rule("my-rest", &[("path", "/a")], "my-eventbus", &[]),
            rule(
                "my-eventbus",
                &[("topic", "t")],
                "my-rest",
                &[("resource", "http://x")],
            ),
            rule(
                "my-rest",
                &[("path", "/a")],
                "my-rest",
                &[("resource", "http://x")],
            ),
            rule(
                "my-eventbus",
                &[("topic", "t"), ("node_name", "n")],
                "my-eventbus",
                &[("topic", "u")],
            ),
            rule(
                "missing",
                &[("path", "/a")],
                "my-eventbus",
                &[("topic", "t")],
            ),
            rule(
                "my-rest",
                &[("path", "/a")],
                "my-rest",
                &[("resource", "ftp://x/")],
            ),
            rule(
                "my-rest",
                &[("path", "/a")],
                "my-rest",
                &[("resource", "/relative")],
            ),
            rule(
                "my-rest",
                &[("path", "/a")],
                "my-eventbus",
                &[("topic", "a/+")],
            ),
            rule(
                "my-eventbus",
                &[("topic", "t"), ("node_name", "Bad_Node")],
                "my-rest",
                &[("resource", "http://x")],
            ),
            rule(
                "my-rest",
                &[("path", "/a"), ("node_name", "ok,Not Ok")],
                "my-eventbus",
                &[("topic", "t")],
            ),
        ];
        for r in cases {
            assert!(compile(&r, &eps).is_err(), "{:?} accepted", r.spec);
        }
        let no_port = endpoints(&[("my-rest", "rest", &[]), ("sb", "servicebus", &[])]);
        assert!(
            compile(
                &rule("my-rest", &[("path", "/a")], "sb", &[("path", "/")]),
                &no_port
            )
            .is_err()
        );
        let bad_port = endpoints(&[
            ("my-rest", "rest", &[]),
            ("sb", "servicebus", &[("service_port", "http")]),
        ]);
        assert!(
            compile(
                &rule("my-rest", &[("path", "/a")], "sb", &[("path", "/")]),
                &bad_port
            )
            .is_err()
        );
    }

    #[test]
    fn rest_sources_may_name_their_nodes() {
        let eps = all_endpoints();
        let r = compile(
            &rule(
                "my-rest",
                &[("path", "/a"), ("node_name", "edge-1, edge-2")],
                "my-eventbus",
                &[("topic", "t")],
            ),
            &eps,
        )
        .unwrap();
        let Source::Rest { nodes, .. } = r.source else {
            panic!()
        };
        assert_eq!(
            nodes.unwrap().into_iter().collect::<Vec<_>>(),
            ["edge-1", "edge-2"]
        );
    }

    #[test]
    fn topics_join_like_go_path_join() {
        assert_eq!(go_path_join("default", "/a/b/"), "default/a/b");
        assert_eq!(go_path_join("default", "a//b"), "default/a/b");
        assert_eq!(go_path_join("default", "../x"), "x");
        assert_eq!(go_path_join("default", "./+/#"), "default/+/#");
    }
}
