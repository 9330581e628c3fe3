//! Reads of one object that arrive together share one apiserver GET. When 100,000 edges start
//! their first pod they each ask for the same `kube-root-ca.crt`; KubeEdge's cloudcore sends
//! the apiserver one GET per question. Here, per object, at most one GET runs at a time, and
//! everyone who asks while it runs waits for the next GET, which starts when it ends and then
//! answers all of them: every answer was read after its question arrived (nothing older than a
//! GET of its own would have been), and the GETs per object are bounded by the apiserver's
//! latency, not by how many edges ask.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// Shared reads by key `K`, answering `V`.
pub struct Coalesce<K, V> {
    /// Keys with a reader task; each holds the callers waiting for its next read.
    keys: Mutex<HashMap<K, Option<watch::Sender<Option<V>>>>>,
}

impl<K, V> Default for Coalesce<K, V> {
    fn default() -> Self {
        Coalesce {
            keys: Mutex::new(HashMap::new()),
        }
    }
}

impl<K, V> Coalesce<K, V>
where
    K: Hash + Eq + Clone + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    fn keys(&self) -> MutexGuard<'_, HashMap<K, Option<watch::Sender<Option<V>>>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer of a `read` of `key` that starts after this call: this caller's own, or one
    /// shared with everyone who asked for `key` while the previous read ran.
    pub async fn get<F, Fut>(self: &Arc<Self>, key: K, read: F) -> V
    where
        F: Fn() -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = V> + Send + 'static,
    {
        let mut rx = {
            let mut keys = self.keys();
            match keys.get_mut(&key) {
                Some(next) => next
                    .get_or_insert_with(|| watch::channel(None).0)
                    .subscribe(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    keys.insert(key.clone(), Some(tx));
                    tokio::spawn(self.clone().reader(key, read.clone()));
                    rx
                }
            }
        };
        loop {
            if let Some(v) = rx.borrow_and_update().clone() {
                return v;
            }
            if rx.changed().await.is_err() {
                // The reader is gone (the runtime is shutting down): ask alone.
                return read().await;
            }
        }
    }

    /// Runs one read after another for `key` while callers wait for one.
    async fn reader<F, Fut>(self: Arc<Self>, key: K, read: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = V>,
    {
        loop {
            let waiting = {
                let mut keys = self.keys();
                match keys.get_mut(&key).and_then(Option::take) {
                    Some(tx) => tx,
                    None => {
                        keys.remove(&key);
                        return;
                    }
                }
            };
            let v = read().await;
            let _ = waiting.send(Some(v));
        }
    }

    /// Keys with a read under way or callers waiting (for tests).
    #[cfg(test)]
    fn busy(&self) -> usize {
        self.keys().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::Notify;

    #[tokio::test]
    async fn callers_arriving_during_a_read_share_the_next_one_and_nothing_older() {
        let c: Arc<Coalesce<&str, usize>> = Arc::default();
        let reads = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Notify::new());
        let reader = {
            let (reads, gate) = (reads.clone(), gate.clone());
            move || {
                let (reads, gate) = (reads.clone(), gate.clone());
                async move {
                    gate.notified().await;
                    // The value is the number of this read: what the object was when it ran.
                    reads.fetch_add(1, Ordering::SeqCst) + 1
                }
            }
        };
        // The first caller starts read 1.
        let first = tokio::spawn({
            let (c, r) = (c.clone(), reader.clone());
            async move { c.get("cm", r).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // 50 callers arrive while read 1 runs: read 1 may be older than their questions.
        let later: Vec<_> = (0..50)
            .map(|_| {
                let (c, r) = (c.clone(), reader.clone());
                tokio::spawn(async move { c.get("cm", r).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        gate.notify_one(); // read 1 ends
        assert_eq!(first.await.expect("first"), 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        gate.notify_one(); // read 2 ends
        for l in later {
            assert_eq!(
                l.await.expect("later"),
                2,
                "answered by the read after theirs"
            );
        }
        assert_eq!(reads.load(Ordering::SeqCst), 2, "51 callers, two reads");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(c.busy(), 0, "nothing left behind once no one waits");
    }

    #[tokio::test]
    async fn other_keys_and_later_callers_read_again() {
        let c: Arc<Coalesce<String, String>> = Arc::default();
        let reads = Arc::new(AtomicUsize::new(0));
        for key in ["a", "b", "a"] {
            let reads = reads.clone();
            let k = key.to_string();
            let v = c
                .get(key.to_string(), move || {
                    let (reads, k) = (reads.clone(), k.clone());
                    async move {
                        reads.fetch_add(1, Ordering::SeqCst);
                        k
                    }
                })
                .await;
            assert_eq!(v, key);
        }
        assert_eq!(
            reads.load(Ordering::SeqCst),
            3,
            "one after another: a read each"
        );
    }
}
