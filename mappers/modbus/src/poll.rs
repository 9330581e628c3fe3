//! One task per device: keeps a Modbus TCP connection, writes changed desired values, polls each
//! property on its `collectCycle`, reports twins on each property's `reportCycle` and the device
//! state when connectivity changes. The task ends when the registry drops the device's sender.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kubeedge_dmi::v1beta1::{Twin, TwinProperty};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_modbus::client::Context;
use tokio_modbus::slave::Slave;

use crate::config::{DeviceConfig, DeviceKey, Endpoint, PropertyConfig};
use crate::modbus::{self, IoError};
use crate::report::{DeviceState, Reporter};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Nothing to do (no properties): sleep until the configuration changes.
const IDLE: Duration = Duration::from_secs(3600);

/// The latest twins of a device, for `GetDevice`.
pub type TwinSnapshot = Arc<Mutex<Vec<Twin>>>;

struct PropertyState {
    config: PropertyConfig,
    next_collect: Instant,
    next_report: Instant,
    /// Last value read, in reported form.
    value: Option<String>,
    /// The desired value last acted on (written, or given up on): each change is written once.
    handled_desired: Option<String>,
    /// The desired value last written successfully.
    written_desired: Option<String>,
    pending_write: Option<String>,
    /// The last read error, so a failing property logs once, not every cycle.
    last_error: Option<String>,
}

impl PropertyState {
    fn observed_desired(&self) -> String {
        match (&self.written_desired, self.config.writable) {
            (Some(written), _) => written.clone(),
            // Nothing to apply on a read-only property: its desired value is what it observes.
            (None, false) => self.config.desired.clone().unwrap_or_default(),
            (None, true) => String::new(),
        }
    }

    fn twin(&self, value: &str) -> Twin {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Twin {
            property_name: self.config.name.clone(),
            reported: Some(TwinProperty {
                value: value.to_string(),
                metadata: HashMap::from([("timestamp".to_string(), millis.to_string())]),
            }),
            observed_desired: Some(TwinProperty {
                value: self.observed_desired(),
                metadata: HashMap::new(),
            }),
        }
    }
}

/// Carries read values and desired-value history over to the new configuration; schedules a
/// write for each changed desired value of a writable property.
fn rebuild(old: Vec<PropertyState>, config: &DeviceConfig, now: Instant) -> Vec<PropertyState> {
    let mut old: HashMap<String, PropertyState> = old
        .into_iter()
        .map(|p| (p.config.name.clone(), p))
        .collect();
    config
        .properties
        .iter()
        .map(|p| {
            let previous = old
                .remove(&p.name)
                .filter(|o| o.config.visitor == p.visitor);
            let (value, handled_desired, written_desired, next_report) = match previous {
                Some(o) => (
                    o.value,
                    o.handled_desired,
                    o.written_desired,
                    o.next_report.min(now + p.report_cycle),
                ),
                None => (None, None, None, now + p.report_cycle),
            };
            let pending_write = p
                .desired
                .clone()
                .filter(|d| p.writable && handled_desired.as_ref() != Some(d));
            PropertyState {
                config: p.clone(),
                next_collect: now,
                next_report,
                value,
                handled_desired,
                written_desired,
                pending_write,
                last_error: None,
            }
        })
        .collect()
}

pub async fn run_device(
    mut config_rx: watch::Receiver<Arc<DeviceConfig>>,
    reporter: Reporter,
    snapshot: TwinSnapshot,
) {
    let mut config = config_rx.borrow_and_update().clone();
    let mut props = rebuild(Vec::new(), &config, Instant::now());
    let mut link: Option<Context> = None;
    let mut state: Option<DeviceState> = None;
    let mut next_connect = Instant::now();
    let mut backoff = MIN_BACKOFF;
    tracing::info!(device = %config.key, endpoint = %config.endpoint, properties = props.len(), "device started");

    loop {
        if link.is_none() && Instant::now() >= next_connect {
            match connect(&config.endpoint).await {
                Ok(ctx) => {
                    tracing::info!(device = %config.key, endpoint = %config.endpoint, "connected");
                    link = Some(ctx);
                    backoff = MIN_BACKOFF;
                }
                Err(error) => {
                    if state != Some(DeviceState::Offline) {
                        tracing::warn!(device = %config.key, endpoint = %config.endpoint, %error, "cannot connect; retrying with back-off");
                    }
                    next_connect = Instant::now() + backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
            let now_state = if link.is_some() {
                DeviceState::Online
            } else {
                DeviceState::Offline
            };
            if state != Some(now_state) {
                reporter.state(&config.key, now_state).await;
                state = Some(now_state);
            }
        }

        if let Some(ctx) = link.as_mut()
            && let Err(error) = exchange(ctx, &mut props, &config.key).await
        {
            tracing::warn!(device = %config.key, %error, "connection lost");
            link = None;
            next_connect = Instant::now() + MIN_BACKOFF;
            reporter.state(&config.key, DeviceState::Offline).await;
            state = Some(DeviceState::Offline);
        }

        report_due(&reporter, &config.key, &mut props).await;
        publish(&snapshot, &props);

        let wake = next_wake(&props, link.is_some(), next_connect);
        tokio::select! {
            () = sleep_until(wake) => {}
            changed = config_rx.changed() => {
                if changed.is_err() {
                    tracing::info!(device = %config.key, "device stopped");
                    return;
                }
                let new = config_rx.borrow_and_update().clone();
                if new.endpoint != config.endpoint {
                    link = None;
                    next_connect = Instant::now();
                    backoff = MIN_BACKOFF;
                }
                props = rebuild(props, &new, Instant::now());
                config = new;
                tracing::info!(device = %config.key, endpoint = %config.endpoint, properties = props.len(), "device updated");
            }
        }
    }
}

async fn connect(endpoint: &Endpoint) -> Result<Context, String> {
    let attempt = async {
        let addr = tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port))
            .await
            .map_err(|e| format!("resolve {}: {e}", endpoint.host))?
            .next()
            .ok_or_else(|| format!("{} has no address", endpoint.host))?;
        tokio_modbus::client::tcp::connect_slave(addr, Slave(endpoint.slave))
            .await
            .map_err(|e| e.to_string())
    };
    tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
}

/// Pending writes, then due reads. Err only when the connection is unusable.
async fn exchange(
    ctx: &mut Context,
    props: &mut [PropertyState],
    device: &DeviceKey,
) -> Result<(), IoError> {
    for p in props.iter_mut() {
        let Some(value) = p.pending_write.clone() else {
            continue;
        };
        match modbus::write(ctx, &p.config.visitor, &value).await {
            Ok(()) => {
                tracing::info!(%device, property = %p.config.name, %value, "desired value written");
                p.written_desired = Some(value.clone());
                p.next_collect = Instant::now();
            }
            Err(e) if e.is_connection() => return Err(e),
            Err(error) => {
                tracing::warn!(%device, property = %p.config.name, %value, %error, "desired value not written");
            }
        }
        p.handled_desired = Some(value);
        p.pending_write = None;
    }
    for p in props.iter_mut() {
        if Instant::now() < p.next_collect {
            continue;
        }
        p.next_collect = Instant::now() + p.config.collect_cycle;
        match modbus::read(ctx, &p.config.visitor).await {
            Ok(value) => {
                if p.last_error.take().is_some() {
                    tracing::info!(%device, property = %p.config.name, "property readable again");
                }
                p.value = Some(value);
            }
            Err(e) if e.is_connection() => return Err(e),
            Err(error) => {
                let error = error.to_string();
                if p.last_error.as_ref() != Some(&error) {
                    tracing::warn!(%device, property = %p.config.name, %error, "cannot read property");
                }
                p.last_error = Some(error);
            }
        }
    }
    Ok(())
}

async fn report_due(reporter: &Reporter, device: &DeviceKey, props: &mut [PropertyState]) {
    let now = Instant::now();
    let mut twins = Vec::new();
    for p in props.iter_mut().filter(|p| now >= p.next_report) {
        p.next_report = now + p.config.report_cycle;
        if let (true, Some(value)) = (p.config.report_to_cloud, &p.value) {
            twins.push(p.twin(value));
        }
    }
    if !twins.is_empty() {
        reporter.twins(device, twins).await;
    }
}

fn publish(snapshot: &TwinSnapshot, props: &[PropertyState]) {
    let twins = props
        .iter()
        .filter_map(|p| p.value.as_deref().map(|v| p.twin(v)))
        .collect();
    if let Ok(mut guard) = snapshot.lock() {
        *guard = twins;
    }
}

fn next_wake(props: &[PropertyState], connected: bool, next_connect: Instant) -> Instant {
    let mut wake = Instant::now() + IDLE;
    for p in props {
        wake = wake.min(p.next_report);
        if connected {
            wake = wake.min(p.next_collect);
        }
    }
    if !connected {
        wake = wake.min(next_connect);
    }
    wake
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modbus::{RegisterKind, Visitor};

    fn config(desired: Option<&str>, kind: RegisterKind) -> DeviceConfig {
        DeviceConfig {
            key: DeviceKey {
                namespace: "ns".into(),
                name: "d".into(),
            },
            endpoint: Endpoint {
                host: "127.0.0.1".into(),
                port: 502,
                slave: 1,
            },
            properties: vec![PropertyConfig {
                name: "p".into(),
                visitor: Visitor {
                    kind,
                    offset: 0,
                    limit: 1,
                    scale: None,
                },
                collect_cycle: Duration::from_secs(1),
                report_cycle: Duration::from_secs(1),
                report_to_cloud: true,
                desired: desired.map(str::to_string),
                writable: kind.is_writable(),
            }],
        }
    }

    #[tokio::test]
    async fn a_desired_value_is_written_once_per_change() {
        let now = Instant::now();
        let props = rebuild(Vec::new(), &config(Some("5"), RegisterKind::Holding), now);
        assert_eq!(props[0].pending_write.as_deref(), Some("5"));

        let mut props = props;
        props[0].handled_desired = props[0].pending_write.take();
        props[0].value = Some("5".into());
        let props = rebuild(props, &config(Some("5"), RegisterKind::Holding), now);
        assert_eq!(props[0].pending_write, None, "unchanged desired value");
        assert_eq!(
            props[0].value.as_deref(),
            Some("5"),
            "the read value is kept"
        );

        let props = rebuild(props, &config(Some("6"), RegisterKind::Holding), now);
        assert_eq!(props[0].pending_write.as_deref(), Some("6"));

        let props = rebuild(props, &config(None, RegisterKind::Holding), now);
        assert_eq!(props[0].pending_write, None);
    }

    #[tokio::test]
    async fn read_only_properties_are_never_written_and_echo_their_desired_value() {
        let props = rebuild(
            Vec::new(),
            &config(Some("5"), RegisterKind::Input),
            Instant::now(),
        );
        assert_eq!(props[0].pending_write, None);
        assert_eq!(props[0].observed_desired(), "5");
        let twin = props[0].twin("7");
        assert_eq!(twin.reported.unwrap().value, "7");
        assert_eq!(twin.observed_desired.unwrap().value, "5");
    }
}
