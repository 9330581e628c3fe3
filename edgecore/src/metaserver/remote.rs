//! Requests the MetaServer sends the cloud's dynamic controller (KubeEdge's Application,
//! `kubeedge_shared::application`), and the watch registrations it keeps there.

use crate::edgehub::CloudLink;
use crate::edgehub::HubError;
use kubeedge_shared::application::{Application, status, watch_sync_request};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// What became of a request to the cloud.
#[derive(Debug)]
pub enum Answer {
    /// The API server's answer (object, list or Status of a delete).
    Ok(Value),
    /// The API server (or the cloud's node restriction) refused: a Kubernetes Status.
    Refused(Value),
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("the cloud is not connected")]
    Offline,
    #[error("the cloud did not answer: {0}")]
    Link(#[from] HubError),
    #[error("the cloud's answer is not usable: {0}")]
    Malformed(String),
    #[error("the cloud failed the request: {0}")]
    Failed(String),
}

/// Sends `app` and waits for the answer.
pub async fn call<L: CloudLink>(
    link: &L,
    app: &Application,
    timeout: Duration,
) -> Result<Answer, RemoteError> {
    if !link.is_connected() {
        return Err(RemoteError::Offline);
    }
    let reply = link.request(app.to_request(), timeout).await?;
    let answer = Application::from_message(&reply).map_err(RemoteError::Malformed)?;
    match answer.status.as_str() {
        status::APPROVED => {
            let body = serde_json::from_slice(&answer.resp_body)
                .map_err(|e| RemoteError::Malformed(format!("answer body: {e}")))?;
            Ok(Answer::Ok(body))
        }
        status::REJECTED => match answer.status_error() {
            Some(s) => Ok(Answer::Refused(s)),
            None => Err(RemoteError::Failed(answer.reason)),
        },
        other => Err(RemoteError::Failed(format!(
            "status {other:?}: {}",
            answer.reason
        ))),
    }
}

/// How long the cloud has to answer a watch sync (it lists every registered scope first).
const SYNC_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The watches this edge keeps registered at the cloud, by Application ID, with how many
/// local watches use each.
#[derive(Default)]
pub struct Registrations {
    apps: Mutex<HashMap<String, (Application, usize)>>,
}

impl Registrations {
    /// Counts a local watch of `app`; true when it is the first (the cloud must be told).
    pub fn add(&self, app: &Application) -> bool {
        let Ok(mut apps) = self.apps.lock() else {
            return false;
        };
        let entry = apps.entry(app.id.clone()).or_insert((app.clone(), 0));
        entry.1 += 1;
        entry.1 == 1
    }

    /// Uncounts a local watch; true when it was the last (the registration ends).
    pub fn remove(&self, id: &str) -> bool {
        let Ok(mut apps) = self.apps.lock() else {
            return false;
        };
        match apps.get_mut(id) {
            Some(e) if e.1 > 1 => {
                e.1 -= 1;
                false
            }
            Some(_) => {
                apps.remove(id);
                true
            }
            None => false,
        }
    }

    pub fn all(&self) -> Vec<Application> {
        self.apps
            .lock()
            .map(|a| a.values().map(|(app, _)| app.clone()).collect())
            .unwrap_or_default()
    }

    /// Tells the cloud every watch this edge keeps (it adds the missing ones and drops the
    /// others), as KubeEdge's watch sync does. Sent on every connect, also with no watch.
    /// Returns how many registrations the cloud said failed (`None`: no answer; a KubeEdge
    /// cloud may not send one).
    pub async fn sync<L: CloudLink>(&self, link: &L) -> Option<usize> {
        let apps = self.all();
        let count = apps.len();
        match link
            .request(watch_sync_request(&apps), SYNC_ANSWER_TIMEOUT)
            .await
        {
            Ok(reply) => {
                let failed = reply.content.as_object().map_or(0, |m| m.len());
                if failed > 0 {
                    tracing::info!(
                        watches = count,
                        failed,
                        "the cloud could not register some watches; registering them again shortly"
                    );
                } else {
                    tracing::debug!(watches = count, "watch registrations sent to the cloud");
                }
                Some(failed)
            }
            Err(e) => {
                tracing::debug!(error = %e, "watch registrations sent; no answer (sent again on the next connect)");
                None
            }
        }
    }
}
