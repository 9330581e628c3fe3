//! The actor owning every Rule and RuleEndpoint: it rebuilds the [`RouteTable`] when either
//! changes, tells the nodes connected to this replica what their edge must now subscribe to or
//! allow (`subscribe`/`unsubscribe`, `start`/`stop`), gives a node that connects everything its
//! rules need (KubeEdge sends these once, when the rule is added, so an edge offline then never
//! gets them), and reports rules that are not in force in their status.
//!
//! Unlike KubeEdge (whose edgecontroller ignores Rule and RuleEndpoint updates), a changed rule
//! or endpoint takes effect at once. A rule is reported not in force only when that lasts
//! [`PROBLEM_GRACE`]: a rule applied together with its endpoints may arrive first (KubeEdge
//! retries such a rule for 30 s). Its loop only moves memory and messages.

use super::metrics::{OperationLabel, RouterMetrics};
use super::rules::{ObjKey, Rule, RuleEndpointSpec};
use super::status::StatusTally;
use super::table::{Registration, RouteTable};
use crate::cloudhub::HubSink;
use crate::controller::kind::Kind;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long a rule must stay out of force before that is reported.
pub const PROBLEM_GRACE: Duration = Duration::from_secs(5);

/// The table in force, shared with the REST listener and the edge traffic handler.
#[derive(Clone, Default)]
pub struct TableHandle(Arc<RwLock<Arc<RouteTable>>>);

impl TableHandle {
    pub fn current(&self) -> Arc<RouteTable> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, t: Arc<RouteTable>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = t;
    }
}

#[derive(Debug)]
pub enum Input {
    RuleApplied(Rule),
    RuleDeleted(ObjKey),
    RulesRelisting,
    RulesListed,
    EndpointApplied(ObjKey, RuleEndpointSpec),
    EndpointDeleted(ObjKey),
    EndpointsRelisting,
    EndpointsListed,
    /// A node connected to this replica.
    NodeConnected(String),
    /// Connection events were missed: every connected node gets its registrations again.
    AllConnected,
}

pub struct RuleSet {
    rules: BTreeMap<ObjKey, Rule>,
    endpoints: BTreeMap<ObjKey, RuleEndpointSpec>,
    /// Objects seen during a relist (the others are gone when it ends).
    relisting_rules: Option<BTreeMap<ObjKey, Rule>>,
    relisting_endpoints: Option<BTreeMap<ObjKey, RuleEndpointSpec>>,
    rules_listed: bool,
    endpoints_listed: bool,
    /// Problems already written to a rule's status: `(uid, text)`.
    reported: HashMap<ObjKey, (String, String)>,
    /// Problems not reported yet: `(uid, text)` and since when.
    noticed: HashMap<ObjKey, ((String, String), Instant)>,
    table: TableHandle,
    hub: Arc<dyn HubSink>,
    tally: StatusTally,
    metrics: RouterMetrics,
}

impl RuleSet {
    pub fn new(
        table: TableHandle,
        hub: Arc<dyn HubSink>,
        tally: StatusTally,
        metrics: RouterMetrics,
    ) -> Self {
        RuleSet {
            rules: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            relisting_rules: None,
            relisting_endpoints: None,
            rules_listed: false,
            endpoints_listed: false,
            reported: HashMap::new(),
            noticed: HashMap::new(),
            table,
            hub,
            tally,
            metrics,
        }
    }

    pub async fn run(mut self, mut rx: mpsc::Receiver<Input>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(PROBLEM_GRACE / 5);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => self.report_problems(Instant::now()),
                i = rx.recv() => match i {
                    Some(i) => self.handle(i),
                    None => return,
                },
            }
        }
    }

    pub fn handle(&mut self, input: Input) {
        let changed = match input {
            Input::RuleApplied(r) => match &mut self.relisting_rules {
                Some(seen) => {
                    seen.insert(r.key(), r);
                    false
                }
                None => self.rules.insert(r.key(), r.clone()).as_ref() != Some(&r),
            },
            Input::RuleDeleted(k) => self.rules.remove(&k).is_some(),
            Input::RulesRelisting => {
                self.relisting_rules = Some(BTreeMap::new());
                false
            }
            Input::RulesListed => {
                if let Some(seen) = self.relisting_rules.take() {
                    self.rules = seen;
                }
                self.rules_listed = true;
                true
            }
            Input::EndpointApplied(k, spec) => match &mut self.relisting_endpoints {
                Some(seen) => {
                    seen.insert(k, spec);
                    false
                }
                None => self.endpoints.insert(k, spec.clone()) != Some(spec),
            },
            Input::EndpointDeleted(k) => self.endpoints.remove(&k).is_some(),
            Input::EndpointsRelisting => {
                self.relisting_endpoints = Some(BTreeMap::new());
                false
            }
            Input::EndpointsListed => {
                if let Some(seen) = self.relisting_endpoints.take() {
                    self.endpoints = seen;
                }
                self.endpoints_listed = true;
                true
            }
            Input::NodeConnected(node) => {
                let table = self.table.current();
                for reg in table.registrations_of(&node) {
                    self.send(&node, &reg, true);
                }
                false
            }
            Input::AllConnected => {
                let table = self.table.current();
                for node in self.hub.connected_nodes() {
                    for reg in table.registrations_of(&node) {
                        self.send(&node, &reg, true);
                    }
                }
                false
            }
        };
        if changed && self.rules_listed && self.endpoints_listed {
            self.rebuild();
        }
    }

    fn rebuild(&mut self) {
        let built = RouteTable::build(&self.rules, &self.endpoints);
        let old = self.table.current();
        let new = Arc::new(built.table);
        self.table.set(new.clone());
        self.metrics.rules.set(new.len() as i64);
        self.metrics.rules_rejected.set(built.problems.len() as i64);
        for (node, reg) in old.registrations().difference(new.registrations()) {
            self.send(node, reg, false);
        }
        for (node, reg) in new.registrations().difference(old.registrations()) {
            self.send(node, reg, true);
        }
        self.reported.retain(|k, _| built.problems.contains_key(k));
        self.noticed.retain(|k, _| built.problems.contains_key(k));
        let now = Instant::now();
        for (key, entry) in built.problems {
            if self.reported.get(&key) == Some(&entry) {
                continue;
            }
            match self.noticed.get(&key) {
                Some((seen, _)) if *seen == entry => {}
                _ => {
                    self.noticed.insert(key, (entry, now));
                }
            }
        }
    }

    /// Reports the problems that have lasted [`PROBLEM_GRACE`] (in the rule's status and the
    /// log), once each.
    pub fn report_problems(&mut self, now: Instant) {
        let due: Vec<ObjKey> = self
            .noticed
            .iter()
            .filter(|(_, (_, since))| now.saturating_duration_since(*since) >= PROBLEM_GRACE)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            let Some(((uid, why), _)) = self.noticed.remove(&key) else {
                continue;
            };
            tracing::warn!(namespace = %key.0, rule = %key.1, reason = %why, "rule not in force");
            self.tally.problem(key.clone(), &uid, &why);
            self.reported.insert(key, (uid, why));
        }
    }

    /// Tells `node`'s edge to hold (or drop) `reg`, when the node is connected here.
    fn send(&self, node: &str, reg: &Registration, add: bool) {
        if !self.hub.is_connected(node) {
            return;
        }
        let (src, op, resource) = match (reg, add) {
            (Registration::Subscribe(t), true) => {
                (source::ROUTER_EVENTBUS, Operation::Subscribe, t)
            }
            (Registration::Subscribe(t), false) => {
                (source::ROUTER_EVENTBUS, Operation::Unsubscribe, t)
            }
            (Registration::Start(u), true) => (source::ROUTER_SERVICEBUS, Operation::Start, u),
            (Registration::Start(u), false) => (source::ROUTER_SERVICEBUS, Operation::Stop, u),
        };
        let label = OperationLabel {
            operation: match op {
                Operation::Subscribe => "subscribe",
                Operation::Unsubscribe => "unsubscribe",
                Operation::Start => "start",
                _ => "stop",
            },
        };
        let msg = Message::new(
            src,
            Group::User,
            op,
            resource.clone(),
            serde_json::Value::Null,
        );
        match self.hub.send(node, msg) {
            Ok(_) => {
                self.metrics.registrations_sent.get_or_create(&label).inc();
            }
            Err(e) => {
                tracing::warn!(node, error = %e, "router registration not sent; sent again when the node reconnects")
            }
        }
    }
}

/// Watches Rules and RuleEndpoints cluster-wide (one watch each) into the actor. Without the
/// CRDs the watches retry quietly after one warning.
pub async fn watch(client: kube::Client, tx: mpsc::Sender<Input>, shutdown: CancellationToken) {
    let rules = watch_kind(client.clone(), true, tx.clone());
    let endpoints = watch_kind(client, false, tx);
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = async { tokio::join!(rules, endpoints) } => {}
    }
}

fn key_of(o: &DynamicObject) -> ObjKey {
    (
        o.metadata.namespace.clone().unwrap_or_default(),
        o.metadata.name.clone().unwrap_or_default(),
    )
}

fn endpoint_spec(o: &DynamicObject) -> RuleEndpointSpec {
    o.data
        .get("spec")
        .cloned()
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default()
}

async fn watch_kind(client: kube::Client, rules: bool, tx: mpsc::Sender<Input>) {
    let ar = if rules {
        Kind::Rule.api_resource()
    } else {
        Kind::RuleEndpoint.api_resource()
    };
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut warned = false;
    while let Some(event) = stream.next().await {
        let input = match (event, rules) {
            (Ok(Event::Apply(o) | Event::InitApply(o)), true) => {
                match serde_json::to_value(&o)
                    .ok()
                    .and_then(|v| Rule::from_object(&v))
                {
                    Some(r) => Input::RuleApplied(r),
                    None => continue,
                }
            }
            (Ok(Event::Delete(o)), true) => Input::RuleDeleted(key_of(&o)),
            (Ok(Event::Init), true) => Input::RulesRelisting,
            (Ok(Event::InitDone), true) => Input::RulesListed,
            (Ok(Event::Apply(o) | Event::InitApply(o)), false) => {
                Input::EndpointApplied(key_of(&o), endpoint_spec(&o))
            }
            (Ok(Event::Delete(o)), false) => Input::EndpointDeleted(key_of(&o)),
            (Ok(Event::Init), false) => Input::EndpointsRelisting,
            (Ok(Event::InitDone), false) => Input::EndpointsListed,
            (Err(e), _) => {
                if !warned {
                    tracing::warn!(resource = %ar.plural, error = %e,
                        "cannot watch rules.kubeedge.io; the router waits for the CRDs (manifests/crds/router-crds.yaml)");
                    warned = true;
                } else {
                    tracing::debug!(resource = %ar.plural, error = %e, "rule watch failed; retrying");
                }
                continue;
            }
        };
        warned = false;
        if tx.send(input).await.is_err() {
            return;
        }
    }
}
