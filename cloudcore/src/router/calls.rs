//! Calls sent to edge applications and waiting for their answer, by message ID. An answer is
//! taken only from the node the call went to (an edge cannot answer another node's calls); a
//! node that disconnects fails its calls at once; a caller that gives up (time-out, client
//! gone) removes its entry. At most `max` calls wait at once.

use crate::cloudhub::BudgetTicket;
use dashmap::DashMap;
use kubeedge_shared::Message;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use tokio::sync::oneshot;

/// How a call ended, other than by its caller giving up.
#[derive(Debug)]
pub enum CallEnd {
    /// The answer, and the bytes it holds of the router's budget until it is relayed.
    Answer(Box<Message>, BudgetTicket),
    /// The node's session ended before it answered.
    Disconnected,
}

/// What became of an answer from an edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Delivered,
    /// No call waits under that ID (late, or never sent).
    Unknown,
    /// The call went to another node.
    WrongNode,
}

struct Waiting {
    node: String,
    tx: oneshot::Sender<CallEnd>,
}

#[derive(Clone)]
pub struct Calls {
    waiting: Arc<DashMap<String, Waiting>>,
    max: usize,
    gauge: Gauge,
}

#[derive(Debug, thiserror::Error)]
#[error("{0} calls are already waiting for edges")]
pub struct TooManyCalls(pub usize);

/// Removes its call when dropped (the caller gave up or got its answer).
pub struct CallGuard {
    calls: Calls,
    id: String,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if self.calls.waiting.remove(&self.id).is_some() {
            self.calls.gauge.dec();
        }
    }
}

impl Calls {
    pub fn new(max: usize, gauge: Gauge) -> Self {
        Calls {
            waiting: Arc::new(DashMap::new()),
            max: max.max(1),
            gauge,
        }
    }

    /// Registers call `id` to `node` before it is sent.
    pub fn register(
        &self,
        id: &str,
        node: &str,
    ) -> Result<(CallGuard, oneshot::Receiver<CallEnd>), TooManyCalls> {
        if self.waiting.len() >= self.max {
            return Err(TooManyCalls(self.max));
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.insert(
            id.to_string(),
            Waiting {
                node: node.to_string(),
                tx,
            },
        );
        self.gauge.inc();
        Ok((
            CallGuard {
                calls: self.clone(),
                id: id.to_string(),
            },
            rx,
        ))
    }

    /// An answer from `node` to call `parent`.
    pub fn answer(&self, node: &str, parent: &str, msg: Message, held: BudgetTicket) -> Delivery {
        let Some((_, w)) = self.waiting.remove_if(parent, |_, w| w.node == node) else {
            return if self.waiting.contains_key(parent) {
                Delivery::WrongNode
            } else {
                Delivery::Unknown
            };
        };
        self.gauge.dec();
        let _ = w.tx.send(CallEnd::Answer(Box::new(msg), held));
        Delivery::Delivered
    }

    /// `node`'s session ended: its calls fail now rather than at their time-out.
    pub fn node_gone(&self, node: &str) -> usize {
        let ids: Vec<String> = self
            .waiting
            .iter()
            .filter(|e| e.node == node)
            .map(|e| e.key().clone())
            .collect();
        let mut n = 0;
        for id in ids {
            if let Some((_, w)) = self.waiting.remove_if(&id, |_, w| w.node == node) {
                self.gauge.dec();
                let _ = w.tx.send(CallEnd::Disconnected);
                n += 1;
            }
        }
        n
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudhub::ByteBudget;
    use kubeedge_shared::{Group, Operation};

    fn held() -> BudgetTicket {
        ByteBudget::new(1).try_take(0).unwrap()
    }

    fn reply() -> Message {
        Message::new(
            "servicebus",
            Group::User,
            Operation::Upload,
            "",
            serde_json::Value::Null,
        )
    }

    #[tokio::test]
    async fn an_answer_reaches_its_caller_only_from_the_called_node() {
        let calls = Calls::new(10, Gauge::default());
        let (_guard, rx) = calls.register("id-1", "edge-a").unwrap();
        assert_eq!(
            calls.answer("edge-b", "id-1", reply(), held()),
            Delivery::WrongNode
        );
        assert_eq!(
            calls.answer("edge-a", "id-2", reply(), held()),
            Delivery::Unknown
        );
        assert_eq!(
            calls.answer("edge-a", "id-1", reply(), held()),
            Delivery::Delivered
        );
        assert!(matches!(rx.await.unwrap(), CallEnd::Answer(..)));
        assert!(calls.is_empty());
    }

    #[tokio::test]
    async fn a_disconnected_node_fails_its_calls_and_a_dropped_guard_forgets_its_call() {
        let gauge = Gauge::default();
        let calls = Calls::new(2, gauge.clone());
        let (_g1, rx1) = calls.register("1", "edge-a").unwrap();
        let (g2, _rx2) = calls.register("2", "edge-b").unwrap();
        assert!(calls.register("3", "edge-a").is_err(), "bounded");
        assert_eq!(calls.node_gone("edge-a"), 1);
        assert!(matches!(rx1.await.unwrap(), CallEnd::Disconnected));
        drop(g2);
        assert!(calls.is_empty());
        assert_eq!(gauge.get(), 0);
    }
}
