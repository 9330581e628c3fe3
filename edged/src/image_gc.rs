//! Image garbage collection, as the kubelet's image GC manager (`pkg/kubelet/images/
//! image_gc_manager.go`): edge machines have small disks.
//!
//! * Every `image_gc_period` (the kubelet's 5 minutes) the image filesystem is measured (the
//!   mountpoint CRI `ImageFsInfo` names, else the filesystem of the runtime's image store).
//!   When its usage reaches `imageGCHighThresholdPercent`, images are removed until usage is
//!   down to `imageGCLowThresholdPercent`; 100 turns the periodic collection off.
//! * Only images no container uses (running or exited, of any pod) are removed, the least
//!   recently used first, never one first seen less than `imageMinimumGCAge` ago, never a
//!   pinned one (CRI `pinned`) nor the sandbox image. First-seen and last-used times live in
//!   memory: images present when edged starts count as seen long ago.
//! * With `imageMaximumGCAge` (newer kubelets; 0: off) images unused for longer are removed
//!   whatever the usage, once edged has run that long.
//! * When the node reports DiskPressure, every unused image that may go is removed at once
//!   (the kubelet's eviction manager calling `DeleteUnusedImages`).
//! * Events as the kubelet's: `FreeDiskSpaceFailed` when not enough could be freed,
//!   `InvalidDiskCapacity`, and `ImageGCFailed` when a collection failed twice in a row.

use super::EdgedConfig;
use super::events::{EventType, ObjectRef};
use super::pod_worker::Shared;
use super::stats::host;
use crate::cri::api;
use crate::cri::runtime::RuntimeError;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Where containerd keeps its images by default: measured when the runtime names no image
/// filesystem.
pub const DEFAULT_IMAGE_STORE: &str = "/var/lib/containerd";

/// The collection policy (`tailoredKubeletConfig.imageGC*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub high_threshold_percent: i32,
    pub low_threshold_percent: i32,
    pub min_age: Duration,
    /// Zero: images are not removed for their age alone.
    pub max_age: Duration,
}

impl Policy {
    pub fn from_config(c: &EdgedConfig) -> Self {
        Policy {
            high_threshold_percent: c.image_gc_high_threshold_percent,
            low_threshold_percent: c.image_gc_low_threshold_percent,
            min_age: c.image_minimum_gc_age,
            max_age: c.image_maximum_gc_age,
        }
    }

    /// Periodic collection runs unless the high threshold is 100 %.
    pub fn enabled(&self) -> bool {
        self.high_threshold_percent < 100
    }

    /// Bytes to free on a filesystem of `capacity` with `available` bytes free: none below
    /// the high threshold, else down to the low threshold (the kubelet's integer arithmetic).
    /// `capacity` must not be zero.
    pub fn bytes_to_free(&self, capacity: u64, available: u64) -> Option<u64> {
        let (capacity, available) = (capacity as u128, available.min(capacity) as u128);
        let usage = 100 - (available * 100 / capacity.max(1)) as i64;
        if usage < i64::from(self.high_threshold_percent) {
            return None;
        }
        let low = self.low_threshold_percent.clamp(0, 100) as u128;
        let target_available = capacity * (100 - low) / 100;
        Some(
            target_available
                .saturating_sub(available)
                .min(u64::MAX as u128) as u64,
        )
    }
}

/// An image as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub id: String,
    /// Tags and digests.
    pub names: Vec<String>,
    pub size: u64,
    pub pinned: bool,
}

impl From<api::Image> for Image {
    fn from(i: api::Image) -> Self {
        Image {
            names: i.repo_tags.into_iter().chain(i.repo_digests).collect(),
            id: i.id,
            size: i.size,
            pinned: i.pinned,
        }
    }
}

impl Image {
    /// Whether a container uses it: `in_use` holds the image IDs and names containers run.
    fn used_by(&self, in_use: &HashSet<String>) -> bool {
        in_use.contains(&self.id) || self.names.iter().any(|n| in_use.contains(n))
    }
}

/// What the collector remembers of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub names: Vec<String>,
    /// When first seen; `None`: at the first look after edged started (long ago).
    pub first_detected: Option<SystemTime>,
    /// When last seen in use by a container; `None`: never.
    pub last_used: Option<SystemTime>,
    pub size: u64,
    pub pinned: bool,
}

/// The images the collector knows of, by ID.
#[derive(Debug, Default)]
pub struct Tracker {
    pub records: HashMap<String, Record>,
    initialized: bool,
    /// When the first look succeeded (`imageMaximumGCAge` counts from there).
    began: Option<SystemTime>,
}

impl Tracker {
    /// Takes in the runtime's images at `now` (the kubelet's `detectImages`); returns the IDs
    /// of those in use. Images gone from the runtime are forgotten.
    pub fn detect(
        &mut self,
        images: &[Image],
        in_use: &HashSet<String>,
        now: SystemTime,
    ) -> HashSet<String> {
        let detected = self.initialized.then_some(now);
        let mut used = HashSet::new();
        for image in images {
            let r = self
                .records
                .entry(image.id.clone())
                .or_insert_with(|| Record {
                    names: Vec::new(),
                    first_detected: detected,
                    last_used: None,
                    size: 0,
                    pinned: false,
                });
            r.names.clone_from(&image.names);
            r.size = image.size;
            r.pinned = image.pinned;
            if image.used_by(in_use) {
                r.last_used = Some(now);
                used.insert(image.id.clone());
            }
        }
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| present.contains(id.as_str()));
        self.initialized = true;
        self.began.get_or_insert(now);
        used
    }
}

/// An image the collector may remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub size: u64,
}

fn since(now: SystemTime, t: Option<SystemTime>) -> Duration {
    t.map_or(Duration::MAX, |t| now.duration_since(t).unwrap_or_default())
}

/// The images a collection at `now` may remove, in the order it removes them: not in use,
/// not pinned, first seen at least `min_age` ago; least recently used first, then the
/// earliest seen (the kubelet's `byLastUsedAndDetected`).
pub fn candidates(
    records: &HashMap<String, Record>,
    in_use: &HashSet<String>,
    now: SystemTime,
    min_age: Duration,
) -> Vec<Candidate> {
    let mut eligible: Vec<(&String, &Record)> = records
        .iter()
        .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
        .filter(|(_, r)| r.last_used.is_none_or(|t| t < now))
        .filter(|(_, r)| since(now, r.first_detected) >= min_age)
        .collect();
    eligible.sort_by(|(a_id, a), (b_id, b)| {
        a.last_used
            .cmp(&b.last_used)
            .then_with(|| a.first_detected.cmp(&b.first_detected))
            .then_with(|| a_id.cmp(b_id))
    });
    eligible
        .into_iter()
        .map(|(id, r)| Candidate {
            id: id.clone(),
            size: r.size,
        })
        .collect()
}

/// The first candidates whose sizes add up to `bytes` (all of them when they do not).
pub fn select(candidates: &[Candidate], bytes: u64) -> &[Candidate] {
    let mut total = 0u64;
    for (i, c) in candidates.iter().enumerate() {
        if total >= bytes {
            return &candidates[..i];
        }
        total = total.saturating_add(c.size);
    }
    candidates
}

/// Images unused for longer than `max_age` (never used: since first seen), once edged has
/// collected for that long (an image between two containers of a restart is not old).
pub fn too_old(
    tracker: &Tracker,
    in_use: &HashSet<String>,
    now: SystemTime,
    max_age: Duration,
) -> Vec<Candidate> {
    if max_age.is_zero() || tracker.began.is_none_or(|b| since(now, Some(b)) < max_age) {
        return Vec::new();
    }
    candidates(&tracker.records, in_use, now, Duration::ZERO)
        .into_iter()
        .filter(|c| {
            let r = &tracker.records[&c.id];
            since(now, r.last_used.or(r.first_detected)) > max_age
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    #[error("cannot measure the image filesystem ({0})")]
    NoStats(String),
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
    )]
    NotEnough { wanted: u64, freed: u64 },
    #[error("removing images failed: {0}")]
    Remove(String),
}

/// The collector: its memory of images and the runtime it works on.
pub struct ImageGc {
    shared: Arc<Shared>,
    policy: Policy,
    tracker: Tracker,
}

impl ImageGc {
    pub fn new(shared: Arc<Shared>) -> Self {
        ImageGc {
            policy: Policy::from_config(&shared.config),
            shared,
            tracker: Tracker::default(),
        }
    }

    /// Lists images and containers and updates the records; returns the IDs in use.
    async fn detect(&mut self, now: SystemTime) -> Result<HashSet<String>, GcError> {
        let runtime = &self.shared.runtime;
        let images: Vec<Image> = runtime
            .list_images()
            .await?
            .into_iter()
            .map(Image::from)
            .collect();
        let mut in_use = HashSet::new();
        for c in runtime.list_containers(HashMap::new()).await? {
            in_use.insert(c.image_ref);
            if let Some(spec) = c.image {
                in_use.insert(spec.image);
            }
        }
        in_use.remove("");
        // The sandbox image stays even if the runtime does not pin it (the kubelet before
        // CRI pinning did the same).
        let sandbox = &self.shared.config.pod_sandbox_image;
        if !sandbox.is_empty() {
            if let Ok(Some(image)) = runtime.image_status(sandbox).await {
                in_use.insert(image.id);
            }
            in_use.insert(sandbox.clone());
        }
        Ok(self.tracker.detect(&images, &in_use, now))
    }

    /// Removes `victims` in order until `bytes` are freed (past one that fails to go, on
    /// to the next); returns the bytes freed and the failures.
    async fn remove(&self, victims: &[Candidate], bytes: u64, why: &str) -> (u64, Vec<String>) {
        let mut freed = 0u64;
        let mut errors = Vec::new();
        let mut rest = victims;
        loop {
            let plan = select(rest, bytes.saturating_sub(freed));
            if plan.is_empty() {
                break;
            }
            for c in plan {
                let names = self
                    .tracker
                    .records
                    .get(&c.id)
                    .map(|r| r.names.clone())
                    .unwrap_or_default();
                match self.shared.runtime.remove_image(&c.id).await {
                    Ok(()) => {
                        tracing::info!(image = %c.id, names = ?names, bytes = c.size, reason = why, "removed an unused image");
                        freed = freed.saturating_add(c.size);
                    }
                    Err(e) => {
                        tracing::warn!(image = %c.id, names = ?names, error = %e, "removing an unused image failed");
                        errors.push(format!("{}: {e}", c.id));
                    }
                }
            }
            rest = &rest[plan.len()..];
        }
        (freed, errors)
    }

    /// Removes unused images to free `bytes` (the kubelet's `freeSpace`).
    async fn free_space(&mut self, bytes: u64, why: &str) -> Result<u64, GcError> {
        let now = SystemTime::now();
        let in_use = self.detect(now).await?;
        let list = candidates(&self.tracker.records, &in_use, now, self.policy.min_age);
        let (freed, errors) = self.remove(&list, bytes, why).await;
        if freed > 0 {
            tracing::info!(
                bytes = freed,
                reason = why,
                "image garbage collection freed space"
            );
        }
        if errors.is_empty() {
            Ok(freed)
        } else {
            Err(GcError::Remove(errors.join("; ")))
        }
    }

    /// One periodic collection (the kubelet's `GarbageCollect`).
    pub async fn collect(&mut self) -> Result<u64, GcError> {
        let mut freed = 0;
        if !self.policy.max_age.is_zero() {
            let now = SystemTime::now();
            let in_use = self.detect(now).await?;
            let old = too_old(&self.tracker, &in_use, now, self.policy.max_age);
            let (n, errors) = self
                .remove(&old, u64::MAX, "unused for imageMaximumGCAge")
                .await;
            freed += n;
            if !errors.is_empty() {
                return Err(GcError::Remove(errors.join("; ")));
            }
        }
        let (capacity, available, path) = self.image_fs().await?;
        if capacity == 0 {
            self.warn("InvalidDiskCapacity", GcError::InvalidCapacity.to_string());
            return Err(GcError::InvalidCapacity);
        }
        let Some(wanted) = self.policy.bytes_to_free(capacity, available) else {
            return Ok(freed);
        };
        let usage = 100 - (available.min(capacity) as u128 * 100 / capacity as u128) as i64;
        tracing::info!(
            filesystem = %path.display(),
            usage,
            high_threshold = self.policy.high_threshold_percent,
            low_threshold = self.policy.low_threshold_percent,
            bytes_to_free = wanted,
            "disk usage on the image filesystem is over the high threshold; freeing bytes down to the low threshold"
        );
        let n = self
            .free_space(wanted, "image filesystem over imageGCHighThresholdPercent")
            .await?;
        freed += n;
        if n < wanted {
            let e = GcError::NotEnough { wanted, freed: n };
            self.warn("FreeDiskSpaceFailed", e.to_string());
            return Err(e);
        }
        Ok(freed)
    }

    /// Removes every unused image that may go (under disk pressure).
    pub async fn delete_unused(&mut self) -> Result<u64, GcError> {
        self.free_space(u64::MAX, "DiskPressure").await
    }

    /// Capacity and available bytes of the image filesystem, and its path.
    async fn image_fs(&self) -> Result<(u64, u64, PathBuf), GcError> {
        let mountpoint = match self.shared.runtime.image_fs_info().await {
            Ok(filesystems) => filesystems
                .into_iter()
                .filter_map(|f| f.fs_id.map(|id| id.mountpoint))
                .find(|m| !m.is_empty()),
            Err(e) => {
                tracing::debug!(error = %e, "ImageFsInfo failed; measuring the image store's filesystem");
                None
            }
        };
        let path = mountpoint.map(PathBuf::from).unwrap_or_else(|| {
            let store = Path::new(DEFAULT_IMAGE_STORE);
            if store.exists() {
                store.to_path_buf()
            } else {
                self.shared.config.root_directory.clone()
            }
        });
        let fs = host::fs_usage(&path)
            .ok_or_else(|| GcError::NoStats(format!("statvfs {} failed", path.display())))?;
        Ok((fs.capacity, fs.available, path))
    }

    fn warn(&self, reason: &str, message: String) {
        let node = ObjectRef::node(&self.shared.config.node_name);
        self.shared
            .events
            .record(&node, EventType::Warning, reason, message);
    }
}

/// Collects every `image_gc_period` (from the start, as the kubelet) while periodic
/// collection is on, and at once when `image_gc_now` is notified (DiskPressure).
pub async fn run(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut gc = ImageGc::new(shared.clone());
    let enabled = gc.policy.enabled();
    if !enabled {
        tracing::info!(
            "imageGCHighThresholdPercent is 100: periodic image garbage collection is off"
        );
    }
    let mut tick = tokio::time::interval(shared.config.image_gc_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failed_before = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick(), if enabled => match gc.collect().await {
                Ok(_) => failed_before = false,
                Err(e) => {
                    if failed_before {
                        tracing::warn!(error = %e, "image garbage collection failed multiple times in a row");
                        gc.warn("ImageGCFailed", e.to_string());
                    } else {
                        tracing::warn!(error = %e, "image garbage collection failed once (the runtime may not be up yet)");
                    }
                    failed_before = true;
                }
            },
            _ = shared.image_gc_now.notified() => match gc.delete_unused().await {
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "deleting unused images under disk pressure failed"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    fn image(id: &str, size: u64) -> Image {
        Image {
            id: id.into(),
            names: vec![format!("registry/{id}:1")],
            size,
            pinned: false,
        }
    }

    fn set(items: &[&str]) -> HashSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn ids(c: &[Candidate]) -> Vec<&str> {
        c.iter().map(|c| c.id.as_str()).collect()
    }

    fn policy(high: i32, low: i32) -> Policy {
        Policy {
            high_threshold_percent: high,
            low_threshold_percent: low,
            min_age: 2 * MIN,
            max_age: Duration::ZERO,
        }
    }

    #[test]
    fn thresholds_decide_how_much_to_free() {
        let p = policy(85, 80);
        // 84 % used: below the high threshold.
        assert_eq!(p.bytes_to_free(1000, 160), None);
        // 85 % used: free down to 80 % (200 available).
        assert_eq!(p.bytes_to_free(1000, 150), Some(50));
        assert_eq!(p.bytes_to_free(1000, 0), Some(200));
        // Available beyond capacity counts as capacity.
        assert_eq!(p.bytes_to_free(1000, 5000), None);
        // high 1 / low 0: anything in use frees everything used.
        assert_eq!(policy(1, 0).bytes_to_free(1000, 600), Some(400));
        assert!(!policy(100, 80).enabled());
        assert!(policy(99, 80).enabled());
    }

    #[test]
    fn unused_images_go_least_recently_used_first_and_never_in_use_pinned_or_young_ones() {
        let mut t = Tracker::default();
        let mut pause = image("pause", 1);
        pause.pinned = true;
        let first = [image("a", 10), image("b", 20), image("c", 30), pause];
        // First look: everything counts as seen long ago; b and c are in use.
        let used = t.detect(&first, &set(&["b", "registry/c:1"]), at(0));
        assert_eq!(used, set(&["b", "c"]));
        // Later: c is not used any more, b still is; d is new.
        let mut second = first.to_vec();
        second.push(image("d", 40));
        let used = t.detect(&second, &set(&["b"]), at(100));
        let list = candidates(&t.records, &used, at(100), 2 * MIN);
        // a was never used (oldest), c last used at 0; b in use, pause pinned, d too young.
        assert_eq!(ids(&list), ["a", "c"]);
        // Once d is old enough it comes last (never used, but seen later than a).
        let used = t.detect(&second, &set(&["b"]), at(300));
        let list = candidates(&t.records, &used, at(300), 2 * MIN);
        assert_eq!(ids(&list), ["a", "d", "c"]);
        // Removed images are forgotten.
        t.detect(&second[1..], &set(&[]), at(400));
        assert!(!t.records.contains_key("a"));
    }

    #[test]
    fn selection_stops_once_enough_bytes_are_freed() {
        let c: Vec<Candidate> = [("a", 10), ("b", 20), ("c", 30)]
            .into_iter()
            .map(|(id, size)| Candidate {
                id: id.into(),
                size,
            })
            .collect();
        assert_eq!(ids(select(&c, 0)), Vec::<&str>::new());
        assert_eq!(ids(select(&c, 10)), ["a"]);
        assert_eq!(ids(select(&c, 11)), ["a", "b"]);
        assert_eq!(ids(select(&c, 1000)), ["a", "b", "c"]);
    }

    #[test]
    fn images_unused_past_the_maximum_age_go_once_edged_ran_that_long() {
        let mut t = Tracker::default();
        t.detect(&[image("a", 1), image("b", 1)], &set(&["b"]), at(0));
        let max = 10 * MIN;
        let used = t.detect(&[image("a", 1), image("b", 1)], &set(&[]), at(300));
        assert!(
            too_old(&t, &used, at(300), max).is_empty(),
            "not running long enough"
        );
        // At 700 s: a was never used and seen at the start (long ago); b was used at 0.
        let used = t.detect(&[image("a", 1), image("b", 1)], &set(&[]), at(700));
        assert!(used.is_empty());
        assert_eq!(ids(&too_old(&t, &used, at(700), max)), ["a", "b"]);
        assert!(too_old(&t, &used, at(700), Duration::ZERO).is_empty());
        // b used again at 700: only a is too old.
        let used = t.detect(&[image("a", 1), image("b", 1)], &set(&["b"]), at(701));
        assert_eq!(ids(&too_old(&t, &used, at(701), max)), ["a"]);
    }
}
