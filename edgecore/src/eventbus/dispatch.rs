//! Hands a received MQTT message to devicetwin or the cloud sink, without ever waiting: a full
//! sink drops the message (warning, at most once a second, and a counter), so the MQTT event
//! loop keeps running and memory stays bounded.

use super::metrics::{DestinationLabel, DropReason, EventBusMetrics};
use super::topics::Destination;
use super::{BusMessage, BusSinks};
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::error::TrySendError;

#[derive(Clone)]
pub(super) struct Dispatcher {
    sinks: Arc<BusSinks>,
    metrics: EventBusMetrics,
    max_payload: usize,
    warnings: Arc<WarnThrottle>,
}

impl Dispatcher {
    pub fn new(sinks: BusSinks, metrics: EventBusMetrics, max_payload: usize) -> Self {
        Dispatcher {
            sinks: Arc::new(sinks),
            metrics,
            max_payload,
            warnings: Arc::new(WarnThrottle::new(Duration::from_secs(1))),
        }
    }

    pub fn metrics(&self) -> &EventBusMetrics {
        &self.metrics
    }

    /// Delivers one message the bus received (the caller checked it matches a subscription).
    pub fn deliver(&self, topic: &str, payload: Bytes) {
        if payload.len() > self.max_payload {
            self.metrics.count_drop(DropReason::Oversized);
            tracing::warn!(
                topic,
                bytes = payload.len(),
                max = self.max_payload,
                "eventbus: dropped an MQTT message larger than the payload limit"
            );
            return;
        }
        let destination = Destination::of(topic);
        let (sink, full) = match destination {
            Destination::Twin => (&self.sinks.twin, DropReason::TwinSinkFull),
            Destination::Cloud => (&self.sinks.cloud, DropReason::CloudSinkFull),
        };
        let message = BusMessage {
            topic: topic.to_string(),
            payload,
        };
        match sink.try_send(message) {
            Ok(()) => {
                self.metrics
                    .received
                    .get_or_create(&DestinationLabel {
                        destination: destination.label(),
                    })
                    .inc();
            }
            Err(TrySendError::Full(m)) => {
                self.metrics.count_drop(full);
                if let Some(suppressed) = self.warnings.allow() {
                    tracing::warn!(
                        topic = %m.topic,
                        destination = destination.label(),
                        suppressed,
                        "eventbus: the {} queue is full, MQTT message dropped",
                        destination.label()
                    );
                }
            }
            Err(TrySendError::Closed(m)) => {
                self.metrics.count_drop(DropReason::SinkClosed);
                if let Some(suppressed) = self.warnings.allow() {
                    tracing::warn!(
                        topic = %m.topic,
                        suppressed,
                        "eventbus: nobody reads the {} queue any more, MQTT message dropped",
                        destination.label()
                    );
                }
            }
        }
    }
}

/// Lets one warning through per interval and counts the ones it held back.
pub(super) struct WarnThrottle {
    start: Instant,
    interval_ms: u64,
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl WarnThrottle {
    pub fn new(interval: Duration) -> Self {
        WarnThrottle {
            start: Instant::now(),
            interval_ms: interval.as_millis().try_into().unwrap_or(u64::MAX),
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(warnings held back since the last one)` when a warning may be logged now.
    pub fn allow(&self) -> Option<u64> {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        if now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(self.interval_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn dispatcher(
        bound: usize,
    ) -> (
        Dispatcher,
        mpsc::Receiver<BusMessage>,
        mpsc::Receiver<BusMessage>,
    ) {
        let (twin, twin_rx) = mpsc::channel(bound);
        let (cloud, cloud_rx) = mpsc::channel(bound);
        let d = Dispatcher::new(BusSinks { twin, cloud }, EventBusMetrics::default(), 16);
        (d, twin_rx, cloud_rx)
    }

    #[test]
    fn messages_go_to_the_sink_of_their_topic() {
        let (d, mut twin, mut cloud) = dispatcher(4);
        d.deliver(
            "$hw/events/device/dev-1/twin/update",
            Bytes::from_static(b"{}"),
        );
        d.deliver("$hw/events/upload/x", Bytes::from_static(b"up"));
        let t = twin.try_recv().unwrap();
        assert_eq!(t.topic, "$hw/events/device/dev-1/twin/update");
        assert_eq!(&t.payload[..], b"{}");
        assert_eq!(cloud.try_recv().unwrap().topic, "$hw/events/upload/x");
        assert!(twin.try_recv().is_err() && cloud.try_recv().is_err());
    }

    #[test]
    fn a_full_sink_drops_and_counts_without_blocking() {
        let (d, mut twin, _cloud) = dispatcher(1);
        for _ in 0..5 {
            d.deliver("$hw/events/node/n/membership/get", Bytes::from_static(b"x"));
        }
        assert_eq!(d.metrics().dropped_count(DropReason::TwinSinkFull), 4);
        assert!(twin.try_recv().is_ok());
        assert!(twin.try_recv().is_err());
    }

    #[test]
    fn oversized_payloads_are_counted_not_delivered() {
        let (d, mut twin, _cloud) = dispatcher(4);
        d.deliver(
            "$hw/events/device/d/twin/update",
            Bytes::from(vec![0u8; 17]),
        );
        assert_eq!(d.metrics().dropped_count(DropReason::Oversized), 1);
        assert!(twin.try_recv().is_err());
    }

    #[test]
    fn a_closed_sink_is_counted() {
        let (d, _twin, cloud) = dispatcher(4);
        drop(cloud);
        d.deliver("x/user/y", Bytes::new());
        assert_eq!(d.metrics().dropped_count(DropReason::SinkClosed), 1);
    }

    #[test]
    fn warnings_are_throttled() {
        let w = WarnThrottle::new(Duration::from_secs(3600));
        assert_eq!(w.allow(), Some(0));
        assert_eq!(w.allow(), None);
        assert_eq!(w.allow(), None);
        let w = WarnThrottle::new(Duration::ZERO);
        assert_eq!(w.allow(), Some(0));
        assert!(w.allow().is_some());
    }
}
