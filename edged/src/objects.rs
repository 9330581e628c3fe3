//! Configmaps and secrets for volumes and env, fetched once for all pods that read them at
//! the same time (one request in flight per object, answers kept a few seconds), and updated
//! from the metamanager's change stream so an update is seen at once.
//!
//! Besides sparing the cloud N identical queries when N pods start (every pod mounts
//! `kube-root-ca.crt`), this keeps identical queries from racing each other through the
//! cloud's per-node queue.

use super::env::ObjectSource;
use crate::meta::MetaClient;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

type Answer = Result<Option<Value>, String>;

use kubeedge_shared::resource_type::ConfigKind;

enum Slot {
    Fetching(watch::Receiver<Option<Answer>>),
    Ready(Instant, Answer),
}

/// The metamanager client with a short-lived, single-flight cache in front.
pub struct ObjectCache {
    meta: MetaClient,
    ttl: Duration,
    slots: Mutex<HashMap<(ConfigKind, String, String), Slot>>,
}

impl ObjectCache {
    pub fn new(meta: MetaClient, ttl: Duration) -> Self {
        ObjectCache {
            meta,
            ttl,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// A change from the metamanager: the stored object (or its removal) is the answer now.
    pub fn changed(&self, kind: ConfigKind, namespace: &str, name: &str, object: Option<Value>) {
        if let Ok(mut slots) = self.slots.lock() {
            slots.insert(
                (kind, namespace.to_string(), name.to_string()),
                Slot::Ready(Instant::now(), Ok(object)),
            );
        }
    }

    async fn get(&self, kind: ConfigKind, namespace: &str, name: &str) -> Answer {
        let key = (kind, namespace.to_string(), name.to_string());
        let sender = {
            let Ok(mut slots) = self.slots.lock() else {
                return Err("object cache poisoned".into());
            };
            slots.retain(|_, s| match s {
                Slot::Ready(at, _) => at.elapsed() < self.ttl,
                Slot::Fetching(_) => true,
            });
            match slots.get(&key) {
                Some(Slot::Ready(_, answer)) => return answer.clone(),
                Some(Slot::Fetching(rx)) => Err(rx.clone()),
                None => {
                    let (tx, rx) = watch::channel(None);
                    slots.insert(key.clone(), Slot::Fetching(rx));
                    Ok(tx)
                }
            }
        };
        match sender {
            Ok(tx) => {
                let answer = match kind {
                    ConfigKind::ConfigMap => self.meta.configmap(namespace, name).await,
                    ConfigKind::Secret => self.meta.secret(namespace, name).await,
                };
                if let Ok(mut slots) = self.slots.lock() {
                    // Failures are not kept: the next caller asks again.
                    match &answer {
                        Ok(_) => {
                            slots.insert(key, Slot::Ready(Instant::now(), answer.clone()));
                        }
                        Err(_) => {
                            slots.remove(&key);
                        }
                    }
                }
                let _ = tx.send(Some(answer.clone()));
                answer
            }
            Err(mut rx) => loop {
                if let Some(answer) = rx.borrow_and_update().clone() {
                    return answer;
                }
                if rx.changed().await.is_err() {
                    // The fetching caller went away (cancelled): fetch ourselves.
                    if let Ok(mut slots) = self.slots.lock()
                        && matches!(slots.get(&key), Some(Slot::Fetching(r)) if r.same_channel(&rx))
                    {
                        slots.remove(&key);
                    }
                    return match kind {
                        ConfigKind::ConfigMap => self.meta.configmap(namespace, name).await,
                        ConfigKind::Secret => self.meta.secret(namespace, name).await,
                    };
                }
            },
        }
    }
}

impl ObjectSource for ObjectCache {
    async fn configmap(&self, namespace: &str, name: &str) -> Answer {
        self.get(ConfigKind::ConfigMap, namespace, name).await
    }

    async fn secret(&self, namespace: &str, name: &str) -> Answer {
        self.get(ConfigKind::Secret, namespace, name).await
    }

    async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: Value,
    ) -> Result<Value, String> {
        self.meta
            .service_account_token(namespace, service_account, request)
            .await
    }
}
