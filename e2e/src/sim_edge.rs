//! A simulated edge for controller tests: a [`RawEdge`] that ACKs what needs an ACK (as
//! metamanager does after its write), with helpers to wait for particular messages; plus the
//! small cluster helpers those tests share (edge nodes, unique names, polling).

use crate::channel::{Pki, RawEdge};
use crate::cloud::CloudFixture;
use crate::cluster::TestCluster;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use kubeedge_shared::{Message, Operation};
use serde_json::json;
use std::future::Future;
use std::time::Duration;

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(20);

/// `prefix` with a random suffix: names that do not collide between tests or runs.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// Creates node `name` with the edge (and agent) role labels, as keadm join does.
pub async fn edge_node(cluster: &TestCluster, name: &str) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "node-role.kubernetes.io/edge": "", "node-role.kubernetes.io/agent": "",
            crate::cluster::TEST_LABEL.0: crate::cluster::TEST_LABEL.1}},
    }))
    .expect("node object");
    Api::<Node>::all(cluster.client())
        .create(&PostParams::default(), &node)
        .await
        .expect("create edge node");
}

/// Deletes node `name`, ignoring errors (cleanup).
pub async fn delete_node(cluster: &TestCluster, name: &str) {
    let _ = Api::<Node>::all(cluster.client())
        .delete(name, &DeleteParams::default())
        .await;
}

/// Polls `check` every 50 ms until it holds; panics naming `what` after [`WAIT`].
pub async fn poll<F, Fut>(mut check: F, what: &str)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Dials `fx`'s cloudhub as `node` advertising `caps`; returns once the session is registered.
pub async fn dial(fx: &CloudFixture, pki: &Pki, node: &str, caps: &[&str]) -> RawEdge {
    let tls = pki
        .edge_tls(&pki.node_cert(node).expect("node certificate"))
        .expect("edge TLS config");
    let raw = RawEdge::connect_with(fx.hub.local_addr(), node, tls, caps)
        .await
        .expect("edge connects");
    poll(
        || async { fx.hub.is_connected(node) },
        &format!("session for {node}"),
    )
    .await;
    raw
}

/// A simulated edge that ACKs every message needing an ACK as it reads it.
pub struct SimEdge {
    pub raw: RawEdge,
}

impl SimEdge {
    /// Connects as `node`; `caps` empty behaves like a KubeEdge edgecore.
    pub async fn connect(fx: &CloudFixture, pki: &Pki, node: &str, caps: &[&str]) -> SimEdge {
        SimEdge {
            raw: dial(fx, pki, node, caps).await,
        }
    }

    /// Next message within `within` (ACKed when it needs an ACK); `None` when none came.
    pub async fn next(&mut self, within: Duration) -> Option<Message> {
        self.raw.keepalive().await.expect("connection open");
        let m = self.raw.recv(within).await.expect("connection open")?;
        if m.requires_ack() {
            self.raw.ack(&m).await.expect("ack sent");
        }
        Some(m)
    }

    /// Messages until one with `op` on `resource` arrives; returns it.
    pub async fn expect(&mut self, op: Operation, resource: &str) -> Message {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let m = self
                .next(left)
                .await
                .unwrap_or_else(|| panic!("no {op} for {resource}"));
            if m.route.operation == op && m.route.resource == resource {
                return m;
            }
        }
    }

    /// Messages until one of each `(op, resource)` has arrived, in any order; returns them in
    /// the order asked.
    pub async fn expect_all(&mut self, wanted: &[(Operation, String)]) -> Vec<Message> {
        let mut found: Vec<Option<Message>> = vec![None; wanted.len()];
        let deadline = tokio::time::Instant::now() + WAIT;
        while found.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let m = self
                .next(left)
                .await
                .unwrap_or_else(|| panic!("not all of {wanted:?} arrived"));
            if let Some(i) = wanted
                .iter()
                .position(|(op, r)| *op == m.route.operation && *r == m.route.resource)
                && found[i].is_none()
            {
                found[i] = Some(m);
            }
        }
        found.into_iter().flatten().collect()
    }

    /// Everything arriving within `d`, ACKed.
    pub async fn drain(&mut self, d: Duration) -> Vec<Message> {
        let deadline = tokio::time::Instant::now() + d;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return out;
            }
            match self.next(left).await {
                Some(m) => out.push(m),
                None => return out,
            }
        }
    }

    /// Sends `msg` and returns the reply to it (other messages meanwhile are ACKed and dropped).
    pub async fn request(&mut self, msg: &Message) -> Message {
        self.raw.send(msg).await.expect("request sent");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let m = self.next(left).await.expect("a reply");
            if m.header.parent_id == msg.header.id {
                return m;
            }
        }
    }
}
