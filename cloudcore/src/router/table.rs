//! The routes in force, built from every Rule and RuleEndpoint: looked up by the REST
//! listener (namespace + path), by edge traffic (node + topic, node + target URL), and the
//! registrations each node's edge must hold (eventbus subscriptions, servicebus target URLs).
//!
//! Rules that compile but clash (the same rest path in a namespace, the same node and topic,
//! the same node and target URL: KubeEdge's webhook refuses the later one) are resolved here:
//! the oldest rule wins, the others are reported in their status.

use super::rules::{self, ObjKey, Route, Rule, RuleEndpointSpec, Source};
use kubeedge_shared::topic;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// What an edge must hold for the rules naming its node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Registration {
    /// The eventbus subscribes to this topic filter (operation `subscribe`).
    Subscribe(String),
    /// The servicebus allows its local applications this target URL (operation `start`).
    Start(String),
}

#[derive(Debug, Default)]
pub struct RouteTable {
    /// Rest-sourced routes by namespace.
    rest: HashMap<String, Vec<Arc<Route>>>,
    /// Eventbus-sourced routes by node, oldest first.
    eventbus: HashMap<String, Vec<Arc<Route>>>,
    /// Servicebus-sourced routes by (node, target URL).
    servicebus: HashMap<(String, String), Arc<Route>>,
    registrations: BTreeSet<(String, Registration)>,
    count: usize,
}

/// A built table and what is wrong with the rules it left out.
pub struct Built {
    pub table: RouteTable,
    /// Rules not in force, with why (keyed by rule; the uid it had).
    pub problems: BTreeMap<ObjKey, (String, String)>,
}

impl RouteTable {
    pub fn build(
        rules: &BTreeMap<ObjKey, Rule>,
        endpoints: &BTreeMap<ObjKey, RuleEndpointSpec>,
    ) -> Built {
        let mut ordered: Vec<&Rule> = rules.values().collect();
        ordered.sort_by(|a, b| {
            (a.created.as_str(), &a.namespace, &a.name).cmp(&(
                b.created.as_str(),
                &b.namespace,
                &b.name,
            ))
        });
        let mut table = RouteTable::default();
        let mut problems = BTreeMap::new();
        let mut claimed: HashMap<String, ObjKey> = HashMap::new();
        for rule in ordered {
            let route = match rules::compile(rule, endpoints) {
                Ok(r) => r,
                Err(e) => {
                    problems.insert(rule.key(), (rule.uid.clone(), e));
                    continue;
                }
            };
            let claim = match &route.source {
                Source::Rest { .. } => format!(
                    "rest {} path {}",
                    route.namespace,
                    rule.spec
                        .source_resource
                        .get("path")
                        .map(|p| p.trim_matches('/'))
                        .unwrap_or_default()
                ),
                Source::EventBus { node, topic } => format!("eventbus {node} topic {topic}"),
                Source::ServiceBus { node, target_url } => {
                    format!("servicebus {node} url {target_url}")
                }
            };
            if let Some((ns, name)) = claimed.get(&claim) {
                problems.insert(
                    rule.key(),
                    (
                        rule.uid.clone(),
                        format!("source properties exist in Rule {ns}/{name} ({claim})"),
                    ),
                );
                continue;
            }
            claimed.insert(claim, rule.key());
            table.insert(Arc::new(route));
        }
        Built { table, problems }
    }

    fn insert(&mut self, route: Arc<Route>) {
        self.count += 1;
        match &route.source {
            Source::Rest { .. } => self
                .rest
                .entry(route.namespace.clone())
                .or_default()
                .push(route),
            Source::EventBus { node, topic } => {
                self.registrations
                    .insert((node.clone(), Registration::Subscribe(topic.clone())));
                self.eventbus.entry(node.clone()).or_default().push(route);
            }
            Source::ServiceBus { node, target_url } => {
                self.registrations
                    .insert((node.clone(), Registration::Start(target_url.clone())));
                self.servicebus
                    .insert((node.clone(), target_url.clone()), route);
            }
        }
    }

    /// Routes in force.
    pub fn len(&self) -> usize {
        self.count
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The rest route for a request's path segments after `/<node>/<namespace>/`, and how many
    /// segments it consumed: the most specific match.
    pub fn match_rest(&self, namespace: &str, segments: &[&str]) -> Option<(Arc<Route>, usize)> {
        self.rest
            .get(namespace)?
            .iter()
            .filter_map(|r| match &r.source {
                Source::Rest { path, .. } => path.match_prefix(segments).map(|m| (r, m)),
                _ => None,
            })
            .max_by_key(|(_, m)| m.rank)
            .map(|(r, m)| (r.clone(), m.consumed))
    }

    /// The eventbus route taking `node`'s message on `topic`: one naming exactly this topic,
    /// else the oldest whose filter matches it.
    pub fn match_eventbus(&self, node: &str, topic_name: &str) -> Option<Arc<Route>> {
        let routes = self.eventbus.get(node)?;
        let filter = |r: &&Arc<Route>| match &r.source {
            Source::EventBus { topic, .. } => Some(topic.clone()),
            _ => None,
        };
        routes
            .iter()
            .find(|r| filter(r).as_deref() == Some(topic_name))
            .or_else(|| {
                routes
                    .iter()
                    .find(|r| filter(r).is_some_and(|f| topic::matches(&f, topic_name)))
            })
            .cloned()
    }

    /// The servicebus route for `node`'s application posting to `url`.
    pub fn match_servicebus(&self, node: &str, url: &str) -> Option<Arc<Route>> {
        self.servicebus
            .get(&(node.to_string(), url.to_string()))
            .cloned()
    }

    /// What `node`'s edge must hold.
    pub fn registrations_of(&self, node: &str) -> Vec<Registration> {
        // The set is ordered by node first, and `Subscribe("")` is a node's least entry.
        let from = (node.to_string(), Registration::Subscribe(String::new()));
        self.registrations
            .range(from..)
            .take_while(|(n, _)| n == node)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Every `(node, registration)`.
    pub fn registrations(&self) -> &BTreeSet<(String, Registration)> {
        &self.registrations
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::rules::RuleSpec;

    fn endpoints() -> BTreeMap<ObjKey, RuleEndpointSpec> {
        [
            ("rest", "rest", None),
            ("bus", "eventbus", None),
            ("sb", "servicebus", Some("8080")),
        ]
        .into_iter()
        .map(|(n, t, port)| {
            (
                ("default".to_string(), n.to_string()),
                RuleEndpointSpec {
                    rule_endpoint_type: t.into(),
                    properties: port
                        .map(|p| [("service_port".to_string(), p.to_string())].into())
                        .unwrap_or_default(),
                },
            )
        })
        .collect()
    }

    fn rule(name: &str, created: &str, spec: RuleSpec) -> (ObjKey, Rule) {
        (
            ("default".into(), name.into()),
            Rule {
                namespace: "default".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
                created: created.into(),
                spec,
            },
        )
    }

    fn spec(source: &str, sr: &[(&str, &str)], target: &str, tr: &[(&str, &str)]) -> RuleSpec {
        let m = |l: &[(&str, &str)]| {
            l.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        RuleSpec {
            source: source.into(),
            source_resource: m(sr),
            target: target.into(),
            target_resource: m(tr),
        }
    }

    #[test]
    fn the_most_specific_rest_rule_wins() {
        let rules = BTreeMap::from([
            rule(
                "a",
                "1",
                spec("rest", &[("path", "/api")], "bus", &[("topic", "a")]),
            ),
            rule(
                "b",
                "2",
                spec(
                    "rest",
                    &[("path", "/api/{v}/items")],
                    "bus",
                    &[("topic", "b")],
                ),
            ),
            rule(
                "c",
                "3",
                spec(
                    "rest",
                    &[("path", "/api/v1/items")],
                    "bus",
                    &[("topic", "c")],
                ),
            ),
        ]);
        let t = RouteTable::build(&rules, &endpoints()).table;
        let (r, n) = t
            .match_rest("default", &["api", "v1", "items", "7"])
            .unwrap();
        assert_eq!((r.name.as_str(), n), ("c", 3));
        let (r, _) = t.match_rest("default", &["api", "v2", "items"]).unwrap();
        assert_eq!(r.name, "b");
        let (r, n) = t.match_rest("default", &["api"]).unwrap();
        assert_eq!((r.name.as_str(), n), ("a", 1));
        assert!(t.match_rest("default", &["other"]).is_none());
        assert!(t.match_rest("kube-system", &["api"]).is_none());
    }

    #[test]
    fn clashing_rules_leave_the_oldest_in_force() {
        let rules = BTreeMap::from([
            rule(
                "new",
                "2026-01-02T00:00:00Z",
                spec("rest", &[("path", "/x/")], "bus", &[("topic", "n")]),
            ),
            rule(
                "old",
                "2026-01-01T00:00:00Z",
                spec("rest", &[("path", "x")], "bus", &[("topic", "o")]),
            ),
            rule(
                "broken",
                "2026-01-01T00:00:00Z",
                spec("rest", &[], "bus", &[("topic", "o")]),
            ),
        ]);
        let built = RouteTable::build(&rules, &endpoints());
        assert_eq!(built.table.len(), 1);
        assert_eq!(
            built.table.match_rest("default", &["x"]).unwrap().0.name,
            "old"
        );
        assert!(
            built.problems[&("default".into(), "new".into())]
                .1
                .contains("Rule default/old")
        );
        assert!(
            built
                .problems
                .contains_key(&("default".into(), "broken".into()))
        );
    }

    #[test]
    fn edge_sources_match_by_node_and_register_there() {
        let rules = BTreeMap::from([
            rule(
                "t",
                "1",
                spec(
                    "bus",
                    &[("topic", "sensors/+"), ("node_name", "edge-1")],
                    "rest",
                    &[("resource", "http://c/in")],
                ),
            ),
            rule(
                "u",
                "2",
                spec(
                    "sb",
                    &[("target_url", "http://c/api"), ("node_name", "edge-2")],
                    "rest",
                    &[("resource", "http://c/api")],
                ),
            ),
        ]);
        let t = RouteTable::build(&rules, &endpoints()).table;
        assert_eq!(
            t.match_eventbus("edge-1", "default/sensors/t1")
                .unwrap()
                .name,
            "t"
        );
        assert!(t.match_eventbus("edge-2", "default/sensors/t1").is_none());
        assert!(t.match_eventbus("edge-1", "default/other").is_none());
        assert_eq!(
            t.match_servicebus("edge-2", "http://c/api").unwrap().name,
            "u"
        );
        assert!(t.match_servicebus("edge-1", "http://c/api").is_none());
        assert_eq!(
            t.registrations_of("edge-1"),
            vec![Registration::Subscribe("default/sensors/+".into())]
        );
        assert_eq!(
            t.registrations_of("edge-2"),
            vec![Registration::Start("http://c/api".into())]
        );
    }
}
