//! The per-node send queue: ordered, bounded, at-least-once for the ACK class.
//!
//! Every message is encoded once when queued; a resend writes the very same frame (same
//! `msg_id`). Pending ACK-class messages of one object (by UID) collapse to the newest, as in
//! KubeEdge's UID-keyed store, but unlike KubeEdge several messages are in flight at once (a
//! window), so one slow ACK does not stall the node.

use crate::metrics::{HubMetrics, ReasonLabel};
use kubeedge_shared::{Group, Message, Operation, ResourcePath, ResourceType};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Utf8Bytes;

#[derive(Debug, Clone)]
pub struct QueueLimits {
    /// Messages (pending + in flight) one node may hold.
    pub max_messages: usize,
    /// Encoded bytes (pending + in flight) one node may hold.
    pub max_bytes: usize,
    /// ACK-class messages sent and not yet acknowledged, at most.
    pub window: usize,
    /// Resend interval while waiting for an ACK (KubeEdge: 5 s).
    pub retry_interval: Duration,
    /// Sends at `retry_interval` before backing off (KubeEdge: 5).
    pub retries_before_backoff: u32,
    /// Ceiling of the exponential backoff after that.
    pub max_backoff: Duration,
}

impl Default for QueueLimits {
    fn default() -> Self {
        use kubeedge_shared::constants::*;
        QueueLimits {
            max_messages: DEFAULT_NODE_QUEUE_MAX_MESSAGES,
            max_bytes: DEFAULT_NODE_QUEUE_MAX_BYTES,
            window: DEFAULT_ACK_WINDOW,
            retry_interval: Duration::from_secs(DEFAULT_ACK_RETRY_SECS),
            retries_before_backoff: 5,
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// What happened to a message handed to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    Queued,
    /// Replaced a pending message for the same object.
    Collapsed,
    /// Older than (or equal to) what is already pending or in flight for the object: dropped.
    Stale,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueFull {
    #[error(
        "node queue full: {messages} messages / {bytes} bytes held (limits {max_messages} / {max_bytes})"
    )]
    Full {
        messages: usize,
        bytes: usize,
        max_messages: usize,
        max_bytes: usize,
    },
}

struct Entry {
    seq: u64,
    frame: Utf8Bytes,
    msg_id: String,
    uid: Option<String>,
    rv: u64,
    is_delete: bool,
    needs_ack: bool,
    resource_type: ResourceType,
    delivered: Option<Box<Delivered>>,
}

impl Entry {
    fn size(&self) -> usize {
        self.frame.len()
    }
}

struct InFlight {
    entry: Entry,
    tries: u32,
    due: Instant,
    /// First sent on this session (ACK latency).
    sent: Instant,
}

#[derive(Default)]
struct State {
    order: VecDeque<u64>,
    pending: HashMap<u64, Entry>,
    pending_by_uid: HashMap<String, u64>,
    inflight: HashMap<String, InFlight>,
    inflight_by_uid: HashMap<String, String>,
    bytes: usize,
    next_seq: u64,
    next_retry: Option<Instant>,
}

/// A message the edge acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckedMessage {
    pub msg_id: String,
    /// `metadata.uid` of the object carried, when there was one.
    pub uid: Option<String>,
    /// The header's `resourceversion` (0 when absent).
    pub resource_version: u64,
    pub resource_type: ResourceType,
    pub is_delete: bool,
    /// The object delivered, on queues that record deliveries.
    pub delivered: Option<Box<Delivered>>,
}

/// The object an ACK-class message of group `resource` carried (also for replies), for
/// recording what an edge holds (KubeEdge's ObjectSync).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// `None` for cluster-scoped objects (the `null` namespace token).
    pub namespace: Option<String>,
    pub resource_type: ResourceType,
    pub name: String,
    pub uid: String,
    /// From the object; empty when it carried none.
    pub api_version: String,
    pub kind: String,
    /// Operation `delete` (a terminating object sent as `update` is not one).
    pub delete: bool,
}

impl Delivered {
    fn of(msg: &Message) -> Option<Box<Delivered>> {
        if msg.route.group != Group::Resource {
            return None;
        }
        let uid = msg.object_uid().filter(|u| !u.is_empty())?;
        let path = ResourcePath::parse(&msg.route.resource).ok()?;
        let text = |k: &str| msg.content[k].as_str().unwrap_or_default().to_string();
        Some(Box::new(Delivered {
            namespace: path.namespace,
            resource_type: path.resource_type,
            name: path.name?,
            uid: uid.to_string(),
            api_version: text("apiVersion"),
            kind: text("kind"),
            delete: msg.route.operation == Operation::Delete,
        }))
    }
}

/// A frame ready to be written.
pub struct Outgoing {
    pub frame: Utf8Bytes,
    pub resource_type: ResourceType,
    pub resend: bool,
}

pub struct NodeQueue {
    state: Mutex<State>,
    notify: Notify,
    limits: QueueLimits,
    metrics: HubMetrics,
    record_deliveries: AtomicBool,
}

/// Most frames handed to the writer per batch, so flushes interleave with large backlogs.
const MAX_BATCH: usize = 256;

impl NodeQueue {
    pub fn new(limits: QueueLimits, metrics: HubMetrics) -> Self {
        NodeQueue {
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            limits,
            metrics,
            record_deliveries: AtomicBool::new(false),
        }
    }

    /// Makes ACKs report the object delivered ([`AckedMessage::delivered`]) for messages
    /// queued from now on.
    pub fn set_record_deliveries(&self, on: bool) {
        self.record_deliveries.store(on, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn drop_metric(&self, reason: &'static str) {
        self.metrics
            .messages_dropped
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Queues an encoded message. `frame` must be the encoding of `msg` (resource trimmed).
    pub fn push(&self, msg: &Message, frame: Utf8Bytes) -> Result<Enqueued, QueueFull> {
        let needs_ack = msg.requires_ack();
        // Replies answer one particular request: two replies carrying the same object (two
        // pods asking for one configmap) are two deliveries, never a collapse.
        let is_reply = !msg.header.parent_id.is_empty();
        let uid = (needs_ack && !is_reply)
            .then(|| msg.object_uid().map(str::to_string))
            .flatten();
        let entry = Entry {
            seq: 0,
            frame,
            msg_id: msg.header.id.clone(),
            uid,
            rv: msg.header.resource_version.parse().unwrap_or(0),
            is_delete: msg.is_delete(),
            needs_ack,
            resource_type: ResourceType::parse(msg.resource_type().unwrap_or_default()),
            delivered: (needs_ack && self.record_deliveries.load(Ordering::Relaxed))
                .then(|| Delivered::of(msg))
                .flatten(),
        };
        let size = entry.size();
        let mut st = self.lock();

        if let Some(uid) = entry.uid.clone() {
            if let Some(&seq) = st.pending_by_uid.get(&uid)
                && let Some(old) = st.pending.get(&seq)
            {
                if supersedes(&entry, old) {
                    let old_size = old.size();
                    let mut entry = entry;
                    entry.seq = seq;
                    st.bytes = st.bytes + size - old_size;
                    self.metrics
                        .queued_bytes
                        .inc_by(size as i64 - old_size as i64);
                    st.pending.insert(seq, entry);
                    drop(st);
                    self.drop_metric("superseded");
                    return Ok(Enqueued::Collapsed);
                }
                drop(st);
                self.drop_metric("stale");
                return Ok(Enqueued::Stale);
            }
            if let Some(msg_id) = st.inflight_by_uid.get(&uid).cloned()
                && let Some(old) = st.inflight.get(&msg_id)
            {
                if !supersedes(&entry, &old.entry) {
                    drop(st);
                    self.drop_metric("stale");
                    return Ok(Enqueued::Stale);
                }
                // The newer version replaces the one in flight: stop resending the old one.
                if let Some(old) = st.inflight.remove(&msg_id) {
                    st.inflight_by_uid.remove(&uid);
                    st.bytes -= old.entry.size();
                    self.metrics.queued_bytes.dec_by(old.entry.size() as i64);
                    self.metrics.inflight_messages.dec();
                    self.metrics.queued_messages.dec();
                }
            }
        }

        let held = st.pending.len() + st.inflight.len();
        if held >= self.limits.max_messages || st.bytes + size > self.limits.max_bytes {
            let err = QueueFull::Full {
                messages: held,
                bytes: st.bytes,
                max_messages: self.limits.max_messages,
                max_bytes: self.limits.max_bytes,
            };
            drop(st);
            self.drop_metric("queue_full");
            return Err(err);
        }

        let mut entry = entry;
        entry.seq = st.next_seq;
        st.next_seq += 1;
        if let Some(uid) = &entry.uid {
            st.pending_by_uid.insert(uid.clone(), entry.seq);
        }
        st.order.push_back(entry.seq);
        st.bytes += size;
        st.pending.insert(entry.seq, entry);
        let depth = st.order.len() + st.inflight.len();
        drop(st);
        self.metrics.node_queue_depth.0.observe(depth as f64);
        self.metrics.queued_messages.inc();
        self.metrics.queued_bytes.inc_by(size as i64);
        self.notify.notify_one();
        Ok(Enqueued::Queued)
    }

    /// Takes what may be written now: due resends first, then new messages while the window
    /// allows. Also returns when to look again if nothing new arrives.
    pub fn take_ready(&self, now: Instant) -> (Vec<Outgoing>, Option<Instant>) {
        let mut out = Vec::new();
        let mut st = self.lock();
        if st.next_retry.is_some_and(|t| t <= now) {
            let mut next: Option<Instant> = None;
            for f in st.inflight.values_mut() {
                if f.due <= now && out.len() < MAX_BATCH {
                    f.tries += 1;
                    f.due = now + self.retry_delay(f.tries);
                    out.push(Outgoing {
                        frame: f.entry.frame.clone(),
                        resource_type: f.entry.resource_type.clone(),
                        resend: true,
                    });
                }
                next = Some(next.map_or(f.due, |n| n.min(f.due)));
            }
            st.next_retry = next;
        }
        while out.len() < MAX_BATCH && st.inflight.len() < self.limits.window {
            let Some(seq) = st.order.pop_front() else {
                break;
            };
            let Some(entry) = st.pending.remove(&seq) else {
                continue;
            };
            if let Some(uid) = &entry.uid
                && st.pending_by_uid.get(uid) == Some(&seq)
            {
                st.pending_by_uid.remove(uid);
            }
            out.push(Outgoing {
                frame: entry.frame.clone(),
                resource_type: entry.resource_type.clone(),
                resend: false,
            });
            if entry.needs_ack {
                let due = now + self.limits.retry_interval;
                st.next_retry = Some(st.next_retry.map_or(due, |n| n.min(due)));
                if let Some(uid) = &entry.uid {
                    st.inflight_by_uid.insert(uid.clone(), entry.msg_id.clone());
                }
                self.metrics.inflight_messages.inc();
                st.inflight.insert(
                    entry.msg_id.clone(),
                    InFlight {
                        entry,
                        tries: 1,
                        due,
                        sent: now,
                    },
                );
            } else {
                st.bytes -= entry.size();
                self.metrics.queued_messages.dec();
                self.metrics.queued_bytes.dec_by(entry.size() as i64);
            }
        }
        let more_ready = !st.order.is_empty() && st.inflight.len() < self.limits.window;
        let next = if more_ready { Some(now) } else { st.next_retry };
        (out, next)
    }

    fn retry_delay(&self, tries: u32) -> Duration {
        let l = &self.limits;
        if tries < l.retries_before_backoff {
            return l.retry_interval;
        }
        // Then doubling: twice the interval after the first retry beyond the linear ones.
        kubeedge_shared::backoff::Backoff::new(l.retry_interval, l.max_backoff)
            .delay_after(tries - l.retries_before_backoff + 2)
    }

    /// Matches an ACK (`parent_msg_id`). Returns what was acknowledged, or `None` for an ACK
    /// that matches nothing in flight (duplicate or late).
    pub fn ack(&self, parent_id: &str) -> Option<AckedMessage> {
        let mut st = self.lock();
        let f = st.inflight.remove(parent_id)?;
        if let Some(uid) = &f.entry.uid
            && st.inflight_by_uid.get(uid).map(String::as_str) == Some(parent_id)
        {
            st.inflight_by_uid.remove(uid);
        }
        st.bytes -= f.entry.size();
        drop(st);
        self.metrics
            .ack_latency
            .0
            .observe(f.sent.elapsed().as_secs_f64());
        self.metrics.inflight_messages.dec();
        self.metrics.queued_messages.dec();
        self.metrics.queued_bytes.dec_by(f.entry.size() as i64);
        self.notify.notify_one();
        let e = f.entry;
        Some(AckedMessage {
            msg_id: e.msg_id,
            uid: e.uid,
            resource_version: e.rv,
            resource_type: e.resource_type,
            is_delete: e.is_delete,
            delivered: e.delivered,
        })
    }

    /// After a session is replaced: everything in flight goes back to the front of the queue
    /// to be sent at once on the new connection (same `msg_id`s).
    pub fn requeue_inflight(&self) {
        let mut st = self.lock();
        let mut back: Vec<InFlight> = st.inflight.drain().map(|(_, f)| f).collect();
        st.inflight_by_uid.clear();
        st.next_retry = None;
        back.sort_by_key(|f| std::cmp::Reverse(f.entry.seq));
        for f in back {
            self.metrics.inflight_messages.dec();
            let e = f.entry;
            if let Some(uid) = &e.uid
                && st.pending_by_uid.contains_key(uid)
            {
                // A newer version is already pending.
                st.bytes -= e.size();
                self.metrics.queued_messages.dec();
                self.metrics.queued_bytes.dec_by(e.size() as i64);
                continue;
            }
            if let Some(uid) = &e.uid {
                st.pending_by_uid.insert(uid.clone(), e.seq);
            }
            st.order.push_front(e.seq);
            st.pending.insert(e.seq, e);
        }
        drop(st);
        self.notify.notify_one();
    }

    /// Waits until something was queued or acknowledged.
    pub async fn changed(&self) {
        self.notify.notified().await
    }

    pub fn len(&self) -> usize {
        let st = self.lock();
        st.pending.len() + st.inflight.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[cfg(test)]
    pub fn inflight_len(&self) -> usize {
        self.lock().inflight.len()
    }
}

impl Drop for NodeQueue {
    fn drop(&mut self) {
        let st = self.lock();
        let held = st.pending.len() + st.inflight.len();
        let (inflight, bytes) = (st.inflight.len(), st.bytes);
        drop(st);
        self.metrics.queued_messages.dec_by(held as i64);
        self.metrics.queued_bytes.dec_by(bytes as i64);
        self.metrics.inflight_messages.dec_by(inflight as i64);
        if held > 0 {
            self.metrics
                .messages_dropped
                .get_or_create(&ReasonLabel {
                    reason: "disconnected",
                })
                .inc_by(held as u64);
        }
    }
}

/// KubeEdge's rule: a pending delete is never replaced by a non-delete, and a non-delete only
/// replaces an older resourceVersion.
fn supersedes(new: &Entry, old: &Entry) -> bool {
    if old.is_delete && !new.is_delete {
        return false;
    }
    new.is_delete || new.rv > old.rv
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::FrameCodec;
    use serde_json::json;

    fn pod(uid: &str, rv: u64, op: Operation) -> Message {
        Message::new(
            "edgecontroller",
            Group::Resource,
            op,
            "default/pod/p",
            json!({"metadata": {"uid": uid, "name": "p", "resourceVersion": rv.to_string()}}),
        )
        .with_resource_version(rv.to_string())
    }

    fn push(q: &NodeQueue, m: &Message) -> Result<Enqueued, QueueFull> {
        let f = FrameCodec::default().encode(m).unwrap();
        q.push(m, f.into())
    }

    fn queue(limits: QueueLimits) -> NodeQueue {
        NodeQueue::new(limits, HubMetrics::default())
    }

    #[tokio::test]
    async fn pending_updates_collapse_to_newest() {
        let q = queue(QueueLimits::default());
        assert_eq!(
            push(&q, &pod("u", 1, Operation::Update)),
            Ok(Enqueued::Queued)
        );
        assert_eq!(
            push(&q, &pod("u", 3, Operation::Update)),
            Ok(Enqueued::Collapsed)
        );
        assert_eq!(
            push(&q, &pod("u", 2, Operation::Update)),
            Ok(Enqueued::Stale)
        );
        let (out, _) = q.take_ready(Instant::now());
        assert_eq!(out.len(), 1);
        assert!(out[0].frame.as_str().contains("\"resourceversion\":\"3\""));
    }

    #[tokio::test]
    async fn replies_carrying_the_same_object_are_never_collapsed() {
        let q = queue(QueueLimits::default());
        let reply = |parent: &str| {
            Message::new(
                "edgecontroller",
                Group::Resource,
                Operation::Response,
                "default/configmap/kube-root-ca.crt",
                json!({"metadata": {"uid": "cm-uid", "resourceVersion": "5"}}),
            )
            .with_resource_version("5")
            .with_parent(parent)
        };
        assert_eq!(push(&q, &reply("q1")), Ok(Enqueued::Queued));
        assert_eq!(push(&q, &reply("q2")), Ok(Enqueued::Queued));
        let (out, _) = q.take_ready(Instant::now());
        assert_eq!(out.len(), 2, "both waiting requests get their reply");
    }

    #[tokio::test]
    async fn pending_delete_is_not_replaced_by_update() {
        let q = queue(QueueLimits::default());
        push(&q, &pod("u", 5, Operation::Delete)).unwrap();
        assert_eq!(
            push(&q, &pod("u", 9, Operation::Update)),
            Ok(Enqueued::Stale)
        );
    }

    #[tokio::test]
    async fn unacked_messages_are_resent_with_same_frame_then_back_off() {
        let limits = QueueLimits {
            retry_interval: Duration::from_millis(10),
            retries_before_backoff: 2,
            ..QueueLimits::default()
        };
        let q = queue(limits);
        let m = pod("u", 1, Operation::Update);
        push(&q, &m).unwrap();
        let t0 = Instant::now();
        let (first, next) = q.take_ready(t0);
        assert_eq!(first.len(), 1);
        assert_eq!(next, Some(t0 + Duration::from_millis(10)));
        let (none, _) = q.take_ready(t0 + Duration::from_millis(5));
        assert!(none.is_empty());
        let t1 = t0 + Duration::from_millis(10);
        let (again, next) = q.take_ready(t1);
        assert_eq!(again.len(), 1);
        assert!(again[0].resend);
        assert_eq!(again[0].frame, first[0].frame, "same msg_id on resend");
        // tries == 2 reached the backoff threshold: 10ms * 2^1
        assert_eq!(next, Some(t1 + Duration::from_millis(20)));
        let acked = q.ack(m.id()).unwrap();
        assert_eq!(acked.resource_type, "pod");
        assert_eq!(acked.uid.as_deref(), Some("u"));
        assert_eq!(acked.resource_version, 1);
        assert_eq!(q.ack(m.id()), None, "duplicate ACK matches nothing");
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn acks_report_the_delivered_object_only_when_recording() {
        let q = queue(QueueLimits::default());
        let plain = pod("u", 1, Operation::Update);
        push(&q, &plain).unwrap();
        q.take_ready(Instant::now());
        assert_eq!(q.ack(plain.id()).unwrap().delivered, None);

        q.set_record_deliveries(true);
        let reply = Message::new(
            "edgecontroller",
            Group::Resource,
            Operation::Response,
            "ns/configmap/cfg",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"uid": "c1", "name": "cfg", "resourceVersion": "7"}}),
        )
        .with_parent("query-1")
        .with_resource_version("7");
        let delete = pod("u", 2, Operation::Delete);
        push(&q, &reply).unwrap();
        push(&q, &delete).unwrap();
        q.take_ready(Instant::now());
        let d = q.ack(reply.id()).unwrap().delivered.unwrap();
        assert_eq!(
            *d,
            Delivered {
                namespace: Some("ns".into()),
                resource_type: "configmap".into(),
                name: "cfg".into(),
                uid: "c1".into(),
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                delete: false,
            }
        );
        let d = q.ack(delete.id()).unwrap().delivered.unwrap();
        assert!(d.delete);
        assert_eq!((d.resource_type.as_str(), d.name.as_str()), ("pod", "p"));
    }

    #[tokio::test]
    async fn newer_version_replaces_the_one_in_flight() {
        let q = queue(QueueLimits::default());
        let old = pod("u", 1, Operation::Update);
        push(&q, &old).unwrap();
        q.take_ready(Instant::now());
        assert_eq!(q.inflight_len(), 1);
        push(&q, &pod("u", 2, Operation::Update)).unwrap();
        assert_eq!(q.inflight_len(), 0, "old version no longer resent");
        assert_eq!(q.ack(old.id()), None);
        assert_eq!(q.len(), 1);
    }

    #[tokio::test]
    async fn window_limits_messages_in_flight() {
        let q = queue(QueueLimits {
            window: 2,
            ..QueueLimits::default()
        });
        for i in 0..5 {
            push(&q, &pod(&format!("u{i}"), 1, Operation::Update)).unwrap();
        }
        let (out, _) = q.take_ready(Instant::now());
        assert_eq!(out.len(), 2);
        let (out2, _) = q.take_ready(Instant::now());
        assert!(out2.is_empty());
    }

    #[tokio::test]
    async fn full_queue_refuses_with_error() {
        let q = queue(QueueLimits {
            max_messages: 2,
            ..QueueLimits::default()
        });
        push(&q, &pod("a", 1, Operation::Update)).unwrap();
        push(&q, &pod("b", 1, Operation::Update)).unwrap();
        assert!(matches!(
            push(&q, &pod("c", 1, Operation::Update)),
            Err(QueueFull::Full { messages: 2, .. })
        ));
    }

    #[tokio::test]
    async fn no_ack_messages_leave_after_one_send() {
        let q = queue(QueueLimits::default());
        let lease = Message::new(
            "edgecontroller",
            Group::Resource,
            Operation::Response,
            "kube-node-lease/lease/e",
            json!({"Object": null, "Err": null}),
        );
        push(&q, &lease).unwrap();
        let (out, next) = q.take_ready(Instant::now());
        assert_eq!(out.len(), 1);
        assert!(q.is_empty());
        assert_eq!(next, None);
    }

    #[tokio::test]
    async fn requeue_after_replacement_sends_inflight_again_first() {
        let q = queue(QueueLimits::default());
        let a = pod("a", 1, Operation::Update);
        push(&q, &a).unwrap();
        q.take_ready(Instant::now());
        push(&q, &pod("b", 1, Operation::Update)).unwrap();
        q.requeue_inflight();
        let (out, _) = q.take_ready(Instant::now());
        assert_eq!(out.len(), 2);
        assert!(out[0].frame.as_str().contains(a.id()));
    }
}
