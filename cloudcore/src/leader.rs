//! Leader election over a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does
//! it: one replica holds the Lease and renews it every `retry_period` (writing over the copy
//! it wrote last, without reading it first; a conflict sends it back to reading); the others
//! take it over
//! once they have seen no change to it for `leaseDurationSeconds` (measured on their own clock,
//! so clock skew between replicas does not matter); every write carries the `resourceVersion` it
//! read, so two replicas never both win. A leader that cannot renew within `renew_deadline`
//! steps down before anyone else may take over (`renew_deadline < lease_duration`), and one that
//! stops releases the Lease so a successor need not wait.
//!
//! For work that must run once across cloudcore replicas (e.g. removing ObjectSync records of
//! deleted nodes). Leadership is advisory: a task checks [`Leadership::is_leader`] right before
//! it acts.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Namespace used when `POD_NAMESPACE` is not set (KubeEdge's).
pub use kubeedge_shared::constants::CLOUDCORE_NAMESPACE as DEFAULT_NAMESPACE;

#[derive(Debug, Clone)]
pub struct ElectionConfig {
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's `holderIdentity`; unique per process.
    pub identity: String,
    /// How long a Lease nobody renews stays valid.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long steps down.
    pub renew_deadline: Duration,
    /// Between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl ElectionConfig {
    /// Timings for work that can wait a minute (client-go's defaults, 15/10/2 s, cost one
    /// read and one write every 2 s for as long as cloudcore runs): renewed every 15 s,
    /// taken over a minute after its leader vanished. The namespace from `POD_NAMESPACE`
    /// (default `kubeedge`); the identity from the host name plus a random suffix.
    pub fn new(name: &str) -> Self {
        ElectionConfig {
            namespace: std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()),
            name: name.to_string(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(60),
            renew_deadline: Duration::from_secs(40),
            retry_period: Duration::from_secs(15),
        }
    }
}

/// `<host name>_<random>`, like client-go's `id + "_" + uuid`.
pub(crate) fn default_identity() -> String {
    let host = ["POD_NAME", "HOSTNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .chain(std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .find(|h| !h.is_empty())
        .unwrap_or_else(|| "cloudcore".to_string());
    format!("{host}_{}", kubeedge_shared::message::new_message_id())
}

/// Whether this replica currently leads; cheap to clone.
#[derive(Clone)]
pub struct Leadership(watch::Receiver<bool>);

impl Leadership {
    pub fn is_leader(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until leadership is `leader`; false when the election has ended.
    pub async fn wait_for(&mut self, leader: bool) -> bool {
        self.0.wait_for(|l| *l == leader).await.is_ok()
    }

    /// Waits for the next change; false when the election has ended.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}

/// Starts campaigning; runs until `shutdown`, then releases the Lease if held.
pub fn spawn(client: kube::Client, cfg: ElectionConfig, shutdown: CancellationToken) -> Leadership {
    let (tx, rx) = watch::channel(false);
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let elector = Elector {
        api,
        cfg,
        observed: Observed::default(),
        written: None,
    };
    tokio::spawn(elector.run(tx, shutdown));
    Leadership(rx)
}

/// The fields of a Lease the election compares.
#[derive(Debug, Clone, PartialEq, Default)]
struct Record {
    holder: String,
    duration: Duration,
    acquire_time: Option<MicroTime>,
    renew_time: Option<MicroTime>,
    transitions: i32,
}

impl Record {
    fn from_spec(spec: Option<&LeaseSpec>) -> Record {
        let Some(s) = spec else {
            return Record::default();
        };
        Record {
            holder: s.holder_identity.clone().unwrap_or_default(),
            duration: Duration::from_secs(s.lease_duration_seconds.unwrap_or(0).max(0) as u64),
            acquire_time: s.acquire_time.clone(),
            renew_time: s.renew_time.clone(),
            transitions: s.lease_transitions.unwrap_or(0),
        }
    }
}

/// What to do with the Lease as last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// Someone else holds a Lease that has not expired.
    Follow,
    /// Ours: write a fresh renew time.
    Renew,
    /// Free, released or expired: write ourselves as holder.
    TakeOver,
}

/// client-go's rule: a Lease held by another is respected until it has gone unchanged, as
/// observed locally, for its own `leaseDurationSeconds`.
fn decide(record: &Record, observed_at: Instant, now: Instant, me: &str) -> Decision {
    if record.holder == me {
        Decision::Renew
    } else if record.holder.is_empty() || observed_at + record.duration <= now {
        Decision::TakeOver
    } else {
        Decision::Follow
    }
}

/// The spec we write for `decision` over `old`.
fn next_spec(old: &Record, decision: Decision, me: &str, duration: Duration) -> LeaseSpec {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let taking_over = decision == Decision::TakeOver;
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(duration.as_secs().max(1) as i32),
        acquire_time: if taking_over || old.acquire_time.is_none() {
            Some(now.clone())
        } else {
            old.acquire_time.clone()
        },
        renew_time: Some(now),
        lease_transitions: Some(if taking_over && !old.holder.is_empty() {
            old.transitions + 1
        } else {
            old.transitions
        }),
        ..LeaseSpec::default()
    }
}

/// The record last read and when it last changed (our clock).
#[derive(Default)]
struct Observed(Option<(Record, Instant)>);

impl Observed {
    fn observe(&mut self, record: Record, now: Instant) {
        if self.0.as_ref().map(|(r, _)| r) != Some(&record) {
            self.0 = Some((record, now));
        }
    }

    fn since(&self) -> Option<Instant> {
        self.0.as_ref().map(|(_, t)| *t)
    }

    fn holder(&self) -> Option<&str> {
        self.0.as_ref().map(|(r, _)| r.holder.as_str())
    }
}

struct Elector {
    api: Api<Lease>,
    cfg: ElectionConfig,
    observed: Observed,
    /// The Lease as we last wrote it while holding it: renewed without reading it again.
    written: Option<Lease>,
}

impl Elector {
    /// One attempt: true when we hold the Lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = Instant::now();
        let me = self.cfg.identity.clone();
        let known = match self.written.take() {
            Some(lease) => Some(lease),
            None => self.api.get_opt(&self.cfg.name).await?,
        };
        let Some(lease) = known else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(next_spec(
                    &Record::default(),
                    Decision::TakeOver,
                    &me,
                    self.cfg.lease_duration,
                )),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed
                        .observe(Record::from_spec(created.spec.as_ref()), now);
                    self.written = Some(created);
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let record = Record::from_spec(lease.spec.as_ref());
        self.observed.observe(record.clone(), now);
        let observed_at = self.observed.since().unwrap_or(now);
        let decision = decide(&record, observed_at, now, &me);
        if decision == Decision::Follow {
            return Ok(false);
        }
        let mut updated = lease;
        updated.spec = Some(next_spec(&record, decision, &me, self.cfg.lease_duration));
        // `metadata.resourceVersion` is the one we read (or wrote): a concurrent writer makes
        // this a 409, and the next attempt reads the Lease again.
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &updated)
            .await
        {
            Ok(written) => {
                self.observed
                    .observe(Record::from_spec(written.spec.as_ref()), now);
                self.written = Some(written);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `try_acquire_or_renew` bounded by the renew deadline (a hung apiserver must not keep us
    /// leading).
    async fn attempt(&mut self) -> bool {
        let limit = self.cfg.renew_deadline.max(Duration::from_millis(100));
        match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(Ok(held)) => held,
            Ok(Err(e)) => {
                tracing::debug!(lease = %self.cfg.name, error = %e, "lease attempt failed");
                false
            }
            Err(_) => {
                tracing::debug!(lease = %self.cfg.name, "lease attempt timed out");
                false
            }
        }
    }

    fn jittered(&self) -> Duration {
        // client-go: wait.JitterUntil(retryPeriod, 1.2): up to 20 % more.
        use std::hash::{BuildHasher, Hasher};
        let permille = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
            % 200;
        self.cfg.retry_period + self.cfg.retry_period * permille as u32 / 1000
    }

    async fn run(mut self, tx: watch::Sender<bool>, shutdown: CancellationToken) {
        loop {
            // Candidate.
            loop {
                if self.attempt().await {
                    break;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(self.jittered()) => {}
                }
            }
            tracing::info!(lease = %self.cfg.name, identity = %self.cfg.identity, "became leader");
            let _ = tx.send(true);
            // Leader.
            let mut renewed = Instant::now();
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        let _ = tx.send(false);
                        self.release().await;
                        return;
                    }
                    _ = tokio::time::sleep(self.cfg.retry_period) => {}
                }
                if self.attempt().await {
                    renewed = Instant::now();
                    continue;
                }
                let taken = self
                    .observed
                    .holder()
                    .is_some_and(|h| h != self.cfg.identity);
                if taken || renewed.elapsed() >= self.cfg.renew_deadline {
                    tracing::warn!(lease = %self.cfg.name, identity = %self.cfg.identity, taken, "lost leadership");
                    let _ = tx.send(false);
                    break;
                }
            }
        }
    }

    /// Gives the Lease up (client-go's `ReleaseOnCancel`): empty holder, 1 s duration.
    async fn release(&mut self) {
        self.written = None;
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await else {
            return;
        };
        let record = Record::from_spec(lease.spec.as_ref());
        if record.holder != self.cfg.identity {
            return;
        }
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(record.transitions),
            ..LeaseSpec::default()
        });
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.cfg.name, "leadership released"),
            Err(e) => tracing::warn!(lease = %self.cfg.name, error = %e, "cannot release lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str, secs: u64) -> Record {
        Record {
            holder: holder.into(),
            duration: Duration::from_secs(secs),
            transitions: 3,
            ..Record::default()
        }
    }

    #[test]
    fn a_lease_held_by_another_is_respected_until_it_goes_unchanged_for_its_duration() {
        let t0 = Instant::now();
        let r = held_by("other", 15);
        assert_eq!(decide(&r, t0, t0, "me"), Decision::Follow);
        assert_eq!(
            decide(&r, t0, t0 + Duration::from_secs(14), "me"),
            Decision::Follow
        );
        assert_eq!(
            decide(&r, t0, t0 + Duration::from_secs(15), "me"),
            Decision::TakeOver
        );
    }

    #[test]
    fn own_lease_is_renewed_and_a_released_one_is_taken_at_once() {
        let t0 = Instant::now();
        assert_eq!(decide(&held_by("me", 15), t0, t0, "me"), Decision::Renew);
        assert_eq!(decide(&held_by("", 1), t0, t0, "me"), Decision::TakeOver);
    }

    #[test]
    fn expiry_is_measured_from_the_last_observed_change_not_the_renew_time() {
        let mut o = Observed::default();
        let t0 = Instant::now();
        let r = held_by("other", 10);
        o.observe(r.clone(), t0);
        // The same record seen again later does not restart the clock...
        o.observe(r.clone(), t0 + Duration::from_secs(5));
        assert_eq!(o.since(), Some(t0));
        // ...a renewal (any change) does.
        let mut renewed = r.clone();
        renewed.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        o.observe(renewed, t0 + Duration::from_secs(8));
        assert_eq!(o.since(), Some(t0 + Duration::from_secs(8)));
    }

    #[test]
    fn takeover_counts_a_transition_and_renewal_keeps_acquire_time() {
        let old = held_by("other", 15);
        let s = next_spec(&old, Decision::TakeOver, "me", Duration::from_secs(15));
        assert_eq!(s.holder_identity.as_deref(), Some("me"));
        assert_eq!(s.lease_transitions, Some(4));
        assert_eq!(s.lease_duration_seconds, Some(15));
        let mine = Record::from_spec(Some(&s));
        let r = next_spec(&mine, Decision::Renew, "me", Duration::from_secs(15));
        assert_eq!(r.lease_transitions, Some(4));
        assert_eq!(r.acquire_time, s.acquire_time);
        // Taking a never-held (or released) lease is not a transition from someone.
        let fresh = next_spec(
            &Record::default(),
            Decision::TakeOver,
            "me",
            Duration::from_secs(15),
        );
        assert_eq!(fresh.lease_transitions, Some(0));
    }
}
