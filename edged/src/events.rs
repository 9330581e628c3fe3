//! Kubernetes Events about pods and the node, as the kubelet records them (`source.component:
//! kubelet`, `source.host: <node>`, `involvedObject` = the pod, with `fieldPath:
//! spec.containers{<name>}` for a container, or the Node, its UID being its name, the event in
//! namespace `default`), sent through the metamanager as KubeEdge's edged does (`insert`/`patch`
//! `<ns>/event/<name>`, protocol §11).
//!
//! Recording never blocks a pod worker: [`Recorder::record`] puts the occurrence on a bounded
//! queue and drops it (debug log) when the queue is full. One task ([`run`]) correlates them
//! like the kubelet's event correlator, simplified:
//!
//! * an identical event (same object, field path, type, reason, message) is not sent again:
//!   its `count` and `lastTimestamp` grow, sent as a patch at most every [`PATCH_INTERVAL`]
//!   (repeats in between are folded into the next patch);
//! * more than [`SIMILAR_LIMIT`] different messages with the same object, type and reason
//!   within [`SIMILAR_WINDOW`] become one event "(combined from similar events): …";
//! * each object may send [`SPAM_BURST`] messages, then one per [`SPAM_REFILL`] (the kubelet's
//!   spam filter); what is held back stays pending, so counts catch up later.
//!
//! While the cloud is unreachable nothing is dropped: events stay pending (with their first
//! timestamp and count) and are sent once the link is back, the oldest first; memory stays
//! bounded by the caches' size ([`CACHE_ENTRIES`], least recently seen evicted first). An
//! event the API server refuses is forgotten.

use super::spec::ObjectMeta;
use crate::meta::MetaClient;
use kubeedge_shared::clock as time;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// `source.component` and `reportingComponent` of every event.
pub const COMPONENT: &str = "kubelet";
/// Occurrences queued for the event task, at most.
pub const QUEUE_CAPACITY: usize = 512;
/// A repeated event is patched at most this often.
pub const PATCH_INTERVAL: Duration = Duration::from_secs(10);
/// Different messages of one object/type/reason before they are combined.
pub const SIMILAR_LIMIT: usize = 10;
pub const SIMILAR_WINDOW: Duration = Duration::from_secs(600);
/// Messages per object before the spam filter holds them back, and its refill period.
pub const SPAM_BURST: f64 = 25.0;
pub const SPAM_REFILL: Duration = Duration::from_secs(300);
/// Entries kept per cache (events, similar-message groups, spam buckets).
pub const CACHE_ENTRIES: usize = 1024;
/// After a send failed for want of a link, pending events wait this long before the next try.
const OFFLINE_RETRY: Duration = Duration::from_secs(1);
/// An event not seen again for this long is forgotten (a later occurrence is a new event), and
/// so are idle spam buckets and similar-message groups: memory follows recent activity, not
/// every pod the node ever ran.
pub const FORGET_AFTER: Duration = Duration::from_secs(900);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What an event is about: a pod, a container of it, or the node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ObjectRef {
    /// `Pod` or `Node`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub field_path: String,
}

impl ObjectRef {
    pub fn pod(meta: &ObjectMeta) -> Self {
        ObjectRef {
            kind: "Pod",
            namespace: meta.namespace.clone(),
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            field_path: String::new(),
        }
    }

    /// The node, as the kubelet refers to it (UID = name, no namespace).
    pub fn node(name: &str) -> Self {
        ObjectRef {
            kind: "Node",
            name: name.to_string(),
            uid: name.to_string(),
            ..ObjectRef::default()
        }
    }

    /// The namespace of events about this object (`default` for cluster-scoped ones).
    fn event_namespace(&self) -> &str {
        if self.namespace.is_empty() {
            "default"
        } else {
            &self.namespace
        }
    }

    /// The same pod, narrowed to a container (`spec.containers{c}` /
    /// `spec.initContainers{c}`).
    pub fn container(&self, name: &str, init: bool) -> Self {
        let list = if init { "initContainers" } else { "containers" };
        ObjectRef {
            field_path: format!("spec.{list}{{{name}}}"),
            ..self.clone()
        }
    }

    fn to_json(&self) -> Value {
        if self.kind == "Node" {
            return json!({"kind": "Node", "name": self.name, "uid": self.uid});
        }
        let mut v = json!({
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "apiVersion": "v1",
        });
        if !self.resource_version.is_empty() {
            v["resourceVersion"] = json!(self.resource_version);
        }
        if !self.field_path.is_empty() {
            v["fieldPath"] = json!(self.field_path);
        }
        v
    }
}

/// One thing that happened.
#[derive(Debug, Clone)]
pub struct Occurrence {
    pub object: ObjectRef,
    pub kind: EventType,
    pub reason: String,
    pub message: String,
    pub at: SystemTime,
}

/// The pod workers' handle: cheap to clone, never blocks.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Occurrence>,
}

impl Recorder {
    pub fn new(capacity: usize) -> (Recorder, mpsc::Receiver<Occurrence>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Recorder { tx }, rx)
    }

    pub fn record(
        &self,
        object: &ObjectRef,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        tracing::debug!(object = %format!("{}/{}/{}", object.kind, object.namespace, object.name), field = %object.field_path, kind = kind.as_str(), reason, %message, "event");
        let occurrence = Occurrence {
            object: object.clone(),
            kind,
            reason: reason.to_string(),
            message,
            at: SystemTime::now(),
        };
        match self.tx.try_send(occurrence) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(o)) => {
                tracing::debug!(reason = %o.reason, "event queue full; event dropped");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

/// What became of one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Sent,
    /// The API server (through the cloud) said no.
    Refused,
    /// The cloud could not be reached: try again later.
    Offline,
}

/// What to send for one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    Create {
        key: String,
        event: Value,
    },
    Patch {
        key: String,
        event: Value,
        patch: Value,
    },
}

impl Outgoing {
    pub fn key(&self) -> &str {
        match self {
            Outgoing::Create { key, .. } | Outgoing::Patch { key, .. } => key,
        }
    }
}

struct Record {
    /// The event as JSON text: a record lives up to [`FORGET_AFTER`], and as a parsed `Value`
    /// (a map per object, a node per few fields) an event takes several times its text. Parsed
    /// again only when sent.
    event: String,
    /// `involvedObject.uid`: the spam filter's key.
    object_uid: String,
    count: i64,
    last: SystemTime,
    /// The cloud has (been sent) this event.
    created: bool,
    /// Occurrences not sent yet.
    dirty: bool,
    sent_at: Option<SystemTime>,
}

struct Similar {
    messages: HashSet<String>,
    since: SystemTime,
    last: SystemTime,
}

struct Bucket {
    tokens: f64,
    at: SystemTime,
}

/// The kubelet's event correlator, simplified (see the module documentation). Pure: time is
/// passed in.
pub struct Correlator {
    host: String,
    records: HashMap<String, Record>,
    similar: HashMap<String, Similar>,
    spam: HashMap<String, Bucket>,
    last_name_nanos: u128,
    pruned_at: Option<SystemTime>,
}

impl Correlator {
    pub fn new(host: &str) -> Self {
        Correlator {
            host: host.to_string(),
            records: HashMap::new(),
            similar: HashMap::new(),
            spam: HashMap::new(),
            last_name_nanos: 0,
            pruned_at: None,
        }
    }

    /// Takes one occurrence; returns what to send now, if anything.
    pub fn observe(&mut self, o: Occurrence) -> Option<Outgoing> {
        let now = o.at;
        let message = self.aggregate(&o, now);
        let key = format!(
            "{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
            o.object.uid,
            o.object.field_path,
            o.kind.as_str(),
            o.reason,
            message
        );
        match self.records.get_mut(&key) {
            Some(r) => {
                r.count += 1;
                r.last = now;
                r.dirty = true;
            }
            None => {
                evict_oldest(&mut self.records, |r| r.last);
                let name = self.event_name(&o.object.name, now);
                let event = self.build(&o, &message, &name).to_string();
                self.records.insert(
                    key.clone(),
                    Record {
                        event,
                        object_uid: o.object.uid.clone(),
                        count: 1,
                        last: now,
                        created: false,
                        dirty: true,
                        sent_at: None,
                    },
                );
            }
        }
        self.outgoing(&key, now)
    }

    /// Pending repeats (and held-back events) that may be sent now.
    pub fn flush(&mut self, now: SystemTime) -> Vec<Outgoing> {
        self.prune(now);
        let mut due: Vec<(SystemTime, String)> = self
            .records
            .iter()
            .filter(|(_, r)| r.dirty)
            .map(|(k, r)| (r.last, k.clone()))
            .collect();
        due.sort();
        due.into_iter()
            .filter_map(|(_, k)| self.outgoing(&k, now))
            .collect()
    }

    /// Forgets (at most once a minute) what has been idle for [`FORGET_AFTER`]: sent events,
    /// similar-message groups, and spam buckets that have refilled.
    fn prune(&mut self, now: SystemTime) {
        let idle = |t: SystemTime| now.duration_since(t).unwrap_or_default() >= FORGET_AFTER;
        if self
            .pruned_at
            .is_some_and(|t| now.duration_since(t).unwrap_or_default() < Duration::from_secs(60))
        {
            return;
        }
        self.pruned_at = Some(now);
        self.records.retain(|_, r| r.dirty || !idle(r.last));
        self.similar.retain(|_, g| !idle(g.last));
        self.spam.retain(|_, b| {
            let refilled = b.tokens
                + now.duration_since(b.at).unwrap_or_default().as_secs_f64()
                    / SPAM_REFILL.as_secs_f64();
            refilled < SPAM_BURST
        });
    }

    /// How many events, similar-message groups and spam buckets are remembered.
    #[cfg(test)]
    pub fn remembered(&self) -> (usize, usize, usize) {
        (self.records.len(), self.similar.len(), self.spam.len())
    }

    /// The outcome of sending `out`: a refused create or patch forgets the event (a later
    /// occurrence starts a new one); one not sent for want of a link stays pending as it was.
    pub fn sent(&mut self, out: &Outgoing, outcome: Outcome) {
        match outcome {
            Outcome::Sent => {}
            Outcome::Refused => {
                self.records.remove(out.key());
            }
            Outcome::Offline => {
                let Some(r) = self.records.get_mut(out.key()) else {
                    return;
                };
                r.dirty = true;
                if matches!(out, Outgoing::Create { .. }) {
                    r.created = false;
                    r.sent_at = None;
                }
                // The spam filter counts what reached the cloud, not attempts.
                if let Some(b) = self.spam.get_mut(&r.object_uid) {
                    b.tokens = (b.tokens + 1.0).min(SPAM_BURST);
                }
            }
        }
    }

    fn outgoing(&mut self, key: &str, now: SystemTime) -> Option<Outgoing> {
        let r = self.records.get(key)?;
        if !r.dirty {
            return None;
        }
        if r.created
            && r.sent_at
                .is_some_and(|t| now.duration_since(t).unwrap_or_default() < PATCH_INTERVAL)
        {
            return None;
        }
        let object_key = r.object_uid.clone();
        if !self.take_token(&object_key, now) {
            return None;
        }
        let r = self.records.get_mut(key)?;
        // The text was written by `observe` from a `Value`: it parses. Were it not to, the
        // record is dropped rather than sent broken.
        let Ok(mut event) = serde_json::from_str::<Value>(&r.event) else {
            self.records.remove(key);
            return None;
        };
        let last = time::rfc3339(r.last);
        event["count"] = json!(r.count);
        event["lastTimestamp"] = json!(last);
        r.dirty = false;
        r.sent_at = Some(now);
        if r.created {
            let patch = json!({
                "count": r.count,
                "lastTimestamp": last,
                "message": event["message"],
            });
            Some(Outgoing::Patch {
                key: key.to_string(),
                event,
                patch,
            })
        } else {
            r.created = true;
            Some(Outgoing::Create {
                key: key.to_string(),
                event,
            })
        }
    }

    /// The message to record: the occurrence's, or the combined one once an object has had
    /// too many different messages for one type and reason.
    fn aggregate(&mut self, o: &Occurrence, now: SystemTime) -> String {
        let key = format!(
            "{}\u{0}{}\u{0}{}\u{0}{}",
            o.object.uid,
            o.object.field_path,
            o.kind.as_str(),
            o.reason
        );
        if !self.similar.contains_key(&key) {
            evict_oldest(&mut self.similar, |s| s.last);
        }
        let group = self.similar.entry(key).or_insert_with(|| Similar {
            messages: HashSet::new(),
            since: now,
            last: now,
        });
        if now.duration_since(group.since).unwrap_or_default() > SIMILAR_WINDOW {
            group.messages.clear();
            group.since = now;
        }
        group.last = now;
        group.messages.insert(o.message.clone());
        if group.messages.len() > SIMILAR_LIMIT {
            format!("(combined from similar events): {}", o.message)
        } else {
            o.message.clone()
        }
    }

    fn take_token(&mut self, object: &str, now: SystemTime) -> bool {
        if !self.spam.contains_key(object) {
            evict_oldest(&mut self.spam, |b| b.at);
        }
        let b = self.spam.entry(object.to_string()).or_insert(Bucket {
            tokens: SPAM_BURST,
            at: now,
        });
        let elapsed = now.duration_since(b.at).unwrap_or_default();
        b.tokens = (b.tokens + elapsed.as_secs_f64() / SPAM_REFILL.as_secs_f64()).min(SPAM_BURST);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// `<object>.<hex nanoseconds>` as the kubelet names events, never twice the same.
    fn event_name(&mut self, object: &str, now: SystemTime) -> String {
        let nanos = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .max(self.last_name_nanos + 1);
        self.last_name_nanos = nanos;
        format!("{object}.{nanos:x}")
    }

    fn build(&self, o: &Occurrence, message: &str, name: &str) -> Value {
        let at = time::rfc3339(o.at);
        json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": o.object.event_namespace()},
            "involvedObject": o.object.to_json(),
            "reason": o.reason,
            "message": message,
            "source": {"component": COMPONENT, "host": self.host},
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
            "type": o.kind.as_str(),
            "reportingComponent": COMPONENT,
            "reportingInstance": self.host,
        })
    }
}

/// Makes room for one more entry: drops the least recently used one when full.
fn evict_oldest<V>(map: &mut HashMap<String, V>, last: impl Fn(&V) -> SystemTime) {
    if map.len() < CACHE_ENTRIES {
        return;
    }
    if let Some(k) = map
        .iter()
        .min_by_key(|(_, v)| last(v))
        .map(|(k, _)| k.clone())
    {
        map.remove(&k);
    }
}

/// The event task: correlates occurrences and sends events until cancelled; `link_up` changes
/// when the cloud link comes back.
pub async fn run(
    meta: MetaClient,
    host: String,
    mut rx: mpsc::Receiver<Occurrence>,
    mut link_up: tokio::sync::watch::Receiver<u64>,
    cancel: CancellationToken,
) {
    let mut correlator = Correlator::new(&host);
    let mut watch_link = true;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut offline_until: Option<tokio::time::Instant> = None;
    loop {
        let out = tokio::select! {
            _ = cancel.cancelled() => return,
            o = rx.recv() => match o {
                Some(o) => correlator.observe(o).into_iter().collect(),
                None => return,
            },
            _ = tick.tick() => correlator.flush(SystemTime::now()),
            // The link is back: what waited goes now.
            changed = link_up.changed(), if watch_link => {
                watch_link = changed.is_ok();
                offline_until = None;
                correlator.flush(SystemTime::now())
            }
        };
        for o in out {
            // While the link is down, one try per OFFLINE_RETRY; the rest stays pending.
            if offline_until.is_some_and(|t| tokio::time::Instant::now() < t) {
                correlator.sent(&o, Outcome::Offline);
                continue;
            }
            let result = match &o {
                Outgoing::Create { event, .. } => meta.create_event(event).await,
                Outgoing::Patch { event, patch, .. } => meta.patch_event(event, patch).await,
            };
            let outcome = match &result {
                Ok(()) => {
                    offline_until = None;
                    Outcome::Sent
                }
                Err(e) if e.is_link_failure() => {
                    tracing::debug!(error = %e, "cloud unreachable; events stay pending");
                    offline_until = Some(tokio::time::Instant::now() + OFFLINE_RETRY);
                    Outcome::Offline
                }
                Err(e) => {
                    tracing::debug!(event = %event_of(&o)["metadata"]["name"], reason = %event_of(&o)["reason"], error = %e, "event refused; dropped");
                    Outcome::Refused
                }
            };
            correlator.sent(&o, outcome);
        }
    }
}

fn event_of(o: &Outgoing) -> &Value {
    match o {
        Outgoing::Create { event, .. } | Outgoing::Patch { event, .. } => event,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> ObjectRef {
        ObjectRef {
            kind: "Pod",
            namespace: "ns".into(),
            name: "web".into(),
            uid: "u1".into(),
            resource_version: "7".into(),
            field_path: String::new(),
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn occ(object: &ObjectRef, reason: &str, message: &str, secs: u64) -> Occurrence {
        Occurrence {
            object: object.clone(),
            kind: EventType::Warning,
            reason: reason.into(),
            message: message.into(),
            at: at(secs),
        }
    }

    #[test]
    fn a_new_event_is_created_like_the_kubelets() {
        let mut c = Correlator::new("edge-1");
        let container = pod().container("app", false);
        let Some(Outgoing::Create { event, .. }) =
            c.observe(occ(&container, "BackOff", "Back-off restarting", 0))
        else {
            panic!("a create");
        };
        assert_eq!(event["kind"], "Event");
        assert_eq!(event["metadata"]["namespace"], "ns");
        assert!(
            event["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("web.")
        );
        assert_eq!(
            event["involvedObject"],
            json!({"kind": "Pod", "namespace": "ns", "name": "web", "uid": "u1",
                   "apiVersion": "v1", "resourceVersion": "7", "fieldPath": "spec.containers{app}"})
        );
        assert_eq!(
            event["source"],
            json!({"component": "kubelet", "host": "edge-1"})
        );
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["count"], 1);
        assert_eq!(event["firstTimestamp"], event["lastTimestamp"]);
        assert_eq!(
            pod().container("init", true).field_path,
            "spec.initContainers{init}"
        );
    }

    #[test]
    fn repeats_are_folded_into_one_patch_per_interval() {
        let mut c = Correlator::new("edge-1");
        let p = pod();
        let Some(Outgoing::Create { event, .. }) = c.observe(occ(&p, "BackOff", "m", 0)) else {
            panic!("a create");
        };
        // Repeats within the interval wait…
        assert_eq!(c.observe(occ(&p, "BackOff", "m", 1)), None);
        assert_eq!(c.observe(occ(&p, "BackOff", "m", 3)), None);
        assert!(c.flush(at(9)).is_empty());
        // …and go as one patch carrying the count, to the same event.
        let out = c.flush(at(10));
        let [
            Outgoing::Patch {
                event: e, patch, ..
            },
        ] = &out[..]
        else {
            panic!("one patch: {out:?}");
        };
        assert_eq!(e["metadata"]["name"], event["metadata"]["name"]);
        assert_eq!(patch["count"], 3);
        assert_eq!(patch["lastTimestamp"], time::rfc3339(at(3)));
        assert!(c.flush(at(30)).is_empty(), "nothing new");
        // A later repeat is patched at once.
        let Some(Outgoing::Patch { patch, .. }) = c.observe(occ(&p, "BackOff", "m", 40)) else {
            panic!("a patch");
        };
        assert_eq!(patch["count"], 4);
        // Another reason, message or container is another event.
        assert!(matches!(
            c.observe(occ(&p, "BackOff", "other", 41)),
            Some(Outgoing::Create { .. })
        ));
        assert!(matches!(
            c.observe(occ(&p.container("c", false), "BackOff", "m", 41)),
            Some(Outgoing::Create { .. })
        ));
    }

    #[test]
    fn a_failed_send_forgets_the_event() {
        let mut c = Correlator::new("edge-1");
        let p = pod();
        let first = c.observe(occ(&p, "Started", "m", 0)).unwrap();
        c.sent(&first, Outcome::Refused);
        assert!(matches!(
            c.observe(occ(&p, "Started", "m", 1)),
            Some(Outgoing::Create { .. })
        ));
    }

    #[test]
    fn events_raised_offline_wait_for_the_link_with_their_counts() {
        let mut c = Correlator::new("edge-1");
        let p = pod();
        let first = c.observe(occ(&p, "BackOff", "m", 0)).unwrap();
        c.sent(&first, Outcome::Offline);
        // Repeats while offline are folded in; every try that fails keeps the event pending.
        for i in 1..=40 {
            for o in c.flush(at(i)) {
                assert!(matches!(o, Outgoing::Create { .. }), "never created yet");
                c.sent(&o, Outcome::Offline);
            }
            // A repeat tries again at once (the event task defers it while offline).
            if let Some(o) = c.observe(occ(&p, "BackOff", "m", i)) {
                assert!(matches!(o, Outgoing::Create { .. }), "never created yet");
                c.sent(&o, Outcome::Offline);
            }
        }
        // Another event of the same pod raised offline: failed tries did not use up the
        // pod's spam-filter budget.
        let other = c.observe(occ(&p, "Started", "s", 41)).unwrap();
        c.sent(&other, Outcome::Offline);
        // Back online: both are created, the oldest first, with what happened meanwhile.
        let out = c.flush(at(60));
        let [
            Outgoing::Create { event: a, .. },
            Outgoing::Create { event: b, .. },
        ] = &out[..]
        else {
            panic!("two creates: {out:?}");
        };
        assert_eq!(a["reason"], "BackOff");
        assert_eq!(a["count"], 41);
        assert_eq!(a["firstTimestamp"], time::rfc3339(at(0)));
        assert_eq!(a["lastTimestamp"], time::rfc3339(at(40)));
        assert_eq!(b["reason"], "Started");
        for o in &out {
            c.sent(o, Outcome::Sent);
        }
        assert!(c.flush(at(61)).is_empty(), "nothing left pending");
    }

    #[test]
    fn node_events_refer_to_the_node_like_the_kubelets() {
        let mut c = Correlator::new("edge-1");
        let node = ObjectRef::node("edge-1");
        let Some(Outgoing::Create { event, key }) = c.observe(Occurrence {
            object: node,
            kind: EventType::Normal,
            reason: "NodeReady".into(),
            message: "Node edge-1 status is now: NodeReady".into(),
            at: at(0),
        }) else {
            panic!("a create");
        };
        assert!(!key.is_empty());
        assert_eq!(event["metadata"]["namespace"], "default");
        assert!(
            event["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("edge-1.")
        );
        assert_eq!(
            event["involvedObject"],
            json!({"kind": "Node", "name": "edge-1", "uid": "edge-1"})
        );
        assert_eq!(event["type"], "Normal");
    }

    #[test]
    fn many_different_messages_are_combined() {
        let mut c = Correlator::new("edge-1");
        let p = pod();
        for i in 0..SIMILAR_LIMIT {
            let out = c.observe(occ(
                &p,
                "Unhealthy",
                &format!("probe failed: {i}"),
                i as u64,
            ));
            assert!(matches!(out, Some(Outgoing::Create { .. })));
        }
        let Some(Outgoing::Create { event, .. }) =
            c.observe(occ(&p, "Unhealthy", "probe failed: x", 20))
        else {
            panic!("a create");
        };
        assert_eq!(
            event["message"],
            "(combined from similar events): probe failed: x"
        );
        // Further different messages count on the combined event.
        assert_eq!(c.observe(occ(&p, "Unhealthy", "probe failed: x", 21)), None);
        let out = c.flush(at(40));
        let [Outgoing::Patch { patch, .. }] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(patch["count"], 2);
    }

    #[test]
    fn the_spam_filter_holds_back_and_releases_later() {
        let mut c = Correlator::new("edge-1");
        let p = pod();
        let mut sent = 0;
        for i in 0..40 {
            if c.observe(occ(&p, &format!("R{i}"), "m", 0)).is_some() {
                sent += 1;
            }
        }
        assert_eq!(sent, SPAM_BURST as usize);
        assert!(c.flush(at(1)).is_empty(), "no token yet");
        // One token per refill period; the oldest held-back event goes first.
        let out = c.flush(at(SPAM_REFILL.as_secs()));
        assert_eq!(out.len(), 1);
        assert!(matches!(&out[0], Outgoing::Create { event, .. } if event["reason"] == "R25"));
        // Another pod is not affected.
        let other = ObjectRef {
            uid: "u2".into(),
            ..pod()
        };
        assert!(c.observe(occ(&other, "R0", "m", 1)).is_some());
    }

    #[test]
    fn idle_state_is_forgotten() {
        let mut c = Correlator::new("edge-1");
        let p = pod();
        let first = c.observe(occ(&p, "Started", "m", 0)).unwrap();
        c.sent(&first, Outcome::Sent);
        assert_eq!(c.remembered(), (1, 1, 1));
        assert!(c.flush(at(60)).is_empty());
        assert_eq!(c.remembered(), (1, 1, 1), "not idle yet");
        c.flush(at(FORGET_AFTER.as_secs() + 60));
        // The spam bucket refilled long ago (one token back after 5 min).
        assert_eq!(c.remembered(), (0, 0, 0));
        // The same event later is a new one.
        assert!(matches!(
            c.observe(occ(&p, "Started", "m", FORGET_AFTER.as_secs() + 61)),
            Some(Outgoing::Create { .. })
        ));
    }

    #[test]
    fn pods_churned_for_hours_leave_bounded_then_no_state() {
        // A pod every 5 s for 3 hours, each with a few events, all sent: what is remembered
        // follows the pods of the last FORGET_AFTER (and never exceeds CACHE_ENTRIES), not
        // every pod the node ever ran.
        let mut c = Correlator::new("edge-1");
        let mut most = 0;
        let mut last = 0;
        for i in 0..2160u64 {
            let p = ObjectRef {
                name: format!("web-{i}"),
                uid: format!("u{i}"),
                ..pod()
            };
            last = i * 5;
            for reason in ["Pulled", "Created", "Started", "Killing"] {
                if let Some(out) = c.observe(occ(&p.container("c", false), reason, "m", last)) {
                    c.sent(&out, Outcome::Sent);
                }
            }
            for out in c.flush(at(last)) {
                c.sent(&out, Outcome::Sent);
            }
            let (records, similar, spam) = c.remembered();
            assert!(records <= CACHE_ENTRIES && similar <= CACHE_ENTRIES && spam <= CACHE_ENTRIES);
            most = most.max(records);
        }
        assert!(
            most >= 4 * 150,
            "the last 15 minutes' events are remembered: {most}"
        );
        // Events and message groups go once idle; a spam bucket once refilled (each pod used
        // 4 tokens: 4 refill periods).
        c.flush(at(last + FORGET_AFTER.as_secs() + 60));
        assert_eq!(c.remembered().0, 0);
        assert_eq!(c.remembered().1, 0);
        c.flush(at(last + 4 * SPAM_REFILL.as_secs() + 120));
        assert_eq!(c.remembered(), (0, 0, 0));
    }

    #[tokio::test]
    async fn recording_never_blocks() {
        let (r, mut rx) = Recorder::new(2);
        for _ in 0..10 {
            r.record(&pod(), EventType::Normal, "Started", "m");
        }
        let mut n = 0;
        while rx.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 2);
    }
}
