//! Eviction signals and thresholds as the kubelet reads them (`evictionHard`,
//! `evictionSoft`, `evictionSoftGracePeriod`): `memory.available`, `nodefs.available`,
//! `nodefs.inodesFree`, `imagefs.available`, `pid.available`, each as a quantity (`100Mi`) or
//! a percentage of capacity (`10%`).

use crate::quantity;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    PidAvailable,
}

impl Signal {
    pub fn parse(s: &str) -> Option<Signal> {
        Some(match s {
            "memory.available" => Signal::MemoryAvailable,
            "nodefs.available" => Signal::NodeFsAvailable,
            "nodefs.inodesFree" => Signal::NodeFsInodesFree,
            "imagefs.available" => Signal::ImageFsAvailable,
            "pid.available" => Signal::PidAvailable,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The resource an eviction for this signal reclaims (the kubelet's messages name it).
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory",
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => "ephemeral-storage",
            Signal::NodeFsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    /// Disk signals: unused images and dead containers are removed before any pod is.
    pub fn is_disk(self) -> bool {
        matches!(
            self,
            Signal::NodeFsAvailable | Signal::NodeFsInodesFree | Signal::ImageFsAvailable
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    Quantity(u64),
    /// Of capacity, 0–100.
    Percent(f64),
}

impl Amount {
    pub fn parse(s: &str) -> Option<Amount> {
        let s = s.trim();
        if let Some(p) = s.strip_suffix('%') {
            let v: f64 = p.trim().parse().ok()?;
            return (0.0..=100.0).contains(&v).then_some(Amount::Percent(v));
        }
        let v = quantity::parse_units(s)?;
        u64::try_from(v).ok().map(Amount::Quantity)
    }

    /// In units of the signal, for a resource of `capacity`.
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Amount::Quantity(q) => q,
            Amount::Percent(p) => (capacity as f64 * p / 100.0) as u64,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: Amount,
    /// Soft thresholds: how long they must hold before pods are evicted; `None`: hard.
    pub grace: Option<Duration>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace.is_none()
    }
}

/// The thresholds of the configuration; entries that cannot be read are returned as errors
/// (the config names them) and left out.
pub fn thresholds(
    hard: &BTreeMap<String, String>,
    soft: &BTreeMap<String, String>,
    soft_grace: &BTreeMap<String, String>,
) -> (Vec<Threshold>, Vec<String>) {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (key, value, kind) in hard
        .iter()
        .map(|(k, v)| (k, v, "evictionHard"))
        .chain(soft.iter().map(|(k, v)| (k, v, "evictionSoft")))
    {
        let Some(signal) = Signal::parse(key) else {
            errors.push(format!("{kind}: unknown signal {key:?}"));
            continue;
        };
        let Some(amount) = Amount::parse(value) else {
            errors.push(format!(
                "{kind}[{key}]: {value:?} is not a quantity or a percentage"
            ));
            continue;
        };
        let grace = if kind == "evictionSoft" {
            match soft_grace
                .get(key)
                .map(|g| kubeedge_shared::duration::parse_go_duration(g))
            {
                Some(Ok(d)) => Some(d),
                Some(Err(e)) => {
                    errors.push(format!("evictionSoftGracePeriod[{key}]: {e}"));
                    continue;
                }
                None => {
                    errors.push(format!(
                        "evictionSoft[{key}] needs an evictionSoftGracePeriod for it"
                    ));
                    continue;
                }
            }
        } else {
            None
        };
        out.push(Threshold {
            signal,
            value: amount,
            grace,
        });
    }
    (out, errors)
}

/// One reading of a signal: what is available of what capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub available: u64,
    pub capacity: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_kubelets_defaults_and_soft_thresholds_parse() {
        let (t, errors) = thresholds(
            &map(&[
                ("memory.available", "100Mi"),
                ("nodefs.available", "10%"),
                ("imagefs.available", "15%"),
                ("nodefs.inodesFree", "5%"),
            ]),
            &map(&[("memory.available", "500Mi")]),
            &map(&[("memory.available", "1m30s")]),
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(t.len(), 5);
        let mem_hard = t
            .iter()
            .find(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .unwrap();
        assert_eq!(mem_hard.value.of(8 << 30), 100 << 20);
        let disk = t
            .iter()
            .find(|t| t.signal == Signal::NodeFsAvailable)
            .unwrap();
        assert_eq!(disk.value.of(1000), 100);
        let soft = t.iter().find(|t| !t.is_hard()).unwrap();
        assert_eq!(soft.grace, Some(Duration::from_secs(90)));
    }

    #[test]
    fn bad_entries_are_named_and_left_out() {
        let (t, errors) = thresholds(
            &map(&[
                ("memory.available", "lots"),
                ("disk.free", "1Gi"),
                ("nodefs.available", "120%"),
            ]),
            &map(&[("memory.available", "1Gi")]),
            &map(&[]),
        );
        assert!(t.is_empty());
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(
            errors
                .iter()
                .any(|e| e.contains("needs an evictionSoftGracePeriod"))
        );
    }
}
