//! Sending the pod's status to the cloud: only when it changed, with a back-off after the
//! API server refused it.

use super::*;
use kubeedge_shared::backoff::Backoff;

/// First and longest wait before a status the API server refused is sent again.
const STATUS_REFUSED_FIRST: Duration = Duration::from_secs(1);
const STATUS_REFUSED_MAX: Duration = Duration::from_secs(300);

/// A refusal worth backing off from: the request itself was wrong (4xx), not a conflict or
/// a throttle the next attempt may not meet.
fn refused(code: i32) -> bool {
    (400..500).contains(&code) && code != 409 && code != 429
}

/// The last status the API server refused, and when to try it again.
pub(super) struct RefusedStatus {
    status: Value,
    reason: String,
    backoff: Backoff,
    retry_at: Instant,
    /// How the refused patch stated the IP lists.
    form: ListForm,
}

impl PodWorker {
    /// Sends the status when it differs from what the cloud last accepted. A status the API
    /// server refused is sent again only after a back-off (doubling up to
    /// [`STATUS_REFUSED_MAX`]) or once it changes; the refusal is logged once per reason.
    pub(super) async fn report(&mut self, status: Value) {
        if let Some(o) = &self.shared.observer {
            o.pod_status(&self.raw, &status);
        }
        if !self.force_report && self.last_sent.as_ref() == Some(&status) {
            self.status_pending = false;
            return;
        }
        if let Some(r) = &self.refused
            && r.status == status
            && Instant::now() < r.retry_at
        {
            self.status_pending = true;
            return;
        }
        let m = metadata_of(&self.raw);
        let (namespace, name) = (m.namespace.clone(), m.name.clone());
        // After a refusal, the other way of stating the IP lists (the known copy was wrong).
        let form = match &self.refused {
            Some(r) if r.form == ListForm::AsKnown => ListForm::Flipped,
            _ => ListForm::AsKnown,
        };
        let uid = if super::super::static_pods::is_static(&self.raw) {
            ""
        } else {
            self.uid.as_str()
        };
        let patch = status_patch(uid, &status, &self.server_status, form);
        let result = self
            .shared
            .meta
            .patch_pod_status(&namespace, &name, &patch)
            .await;
        let outcome = match &result {
            Ok(_) => Outcome::Accepted,
            Err(MetaError::Api(e)) if refused(e.err_status.code) => Outcome::Refused,
            Err(_) => Outcome::Failed,
        };
        self.shared
            .status_reports
            .record(&namespace, &name, outcome);
        match result {
            Ok(pod) => {
                if let Some(s) = pod.get("status") {
                    self.server_status = s.clone();
                }
                tracing::debug!(pod = %self.key(), phase = %status["phase"], "pod status sent");
                if self.refused.take().is_some() {
                    tracing::info!(pod = %self.key(), "pod status accepted again");
                }
                self.last_sent = Some(status);
                self.status_pending = false;
                self.force_report = false;
            }
            Err(MetaError::NotFound { .. }) => {
                // The pod is gone at the API server: nothing to report any more.
                self.refused = None;
                self.last_sent = Some(status);
                self.status_pending = false;
                self.force_report = false;
            }
            Err(MetaError::Api(e)) if refused(e.err_status.code) => {
                let reason = format!("{} {}", e.err_status.code, e.err_status.message);
                let mut backoff = self.refused.as_ref().map_or_else(
                    || Backoff::new(STATUS_REFUSED_FIRST, STATUS_REFUSED_MAX),
                    |r| r.backoff.clone(),
                );
                let delay = backoff.next_delay();
                if self.refused.as_ref().is_none_or(|r| r.reason != reason) {
                    tracing::warn!(
                        pod = %self.key(),
                        code = e.err_status.code,
                        reason = %e.err_status.reason,
                        message = %e.err_status.message,
                        retry_in = ?delay,
                        "the API server refused the pod status; sending it again with back-off"
                    );
                }
                self.refused = Some(RefusedStatus {
                    status,
                    reason,
                    backoff,
                    retry_at: Instant::now() + delay,
                    form,
                });
                self.status_pending = true;
            }
            Err(e) => {
                if !self.status_pending {
                    tracing::info!(pod = %self.key(), error = %e, "pod status not sent; will retry");
                }
                self.status_pending = true;
            }
        }
    }
}
