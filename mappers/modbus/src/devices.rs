//! The mapper's devices and models, and a running poll task per usable device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kubeedge_dmi::v1beta1::{Device, DeviceModel, DeviceStatus};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{DeviceConfig, DeviceKey, device_config};
use crate::poll::{TwinSnapshot, run_device};
use crate::report::{DeviceState, Reporter};

/// `<namespace>/<name>` of a model (DMI refers to models by name within the device's namespace).
type ModelKey = (String, String);

struct Running {
    config: watch::Sender<Arc<DeviceConfig>>,
    twins: TwinSnapshot,
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Entry {
    device: Device,
    /// None while the device's configuration is unusable.
    running: Option<Running>,
}

#[derive(Default)]
struct Inner {
    devices: HashMap<DeviceKey, Entry>,
    models: HashMap<ModelKey, DeviceModel>,
}

/// Shared by the gRPC server and the registration step; never held across an await.
pub struct Devices {
    inner: Mutex<Inner>,
    reporter: Reporter,
}

impl Devices {
    pub fn new(reporter: Reporter) -> Arc<Self> {
        Arc::new(Devices {
            inner: Mutex::new(Inner::default()),
            reporter,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere must not stop device management: the maps stay consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds or replaces a device and (re)starts or updates its poll task. Call from a tokio
    /// runtime.
    pub fn upsert(&self, device: Device) {
        let key = DeviceKey::of(&device);
        let mut inner = self.lock();
        let model_key = (
            device.namespace.clone(),
            device
                .spec
                .as_ref()
                .map(|s| s.device_model_reference.clone())
                .unwrap_or_default(),
        );
        let model = inner.models.get(&model_key).cloned();
        let previous = inner.devices.remove(&key).and_then(|e| e.running);
        let running = match device_config(&device, model.as_ref()) {
            Ok((config, skipped)) => {
                for s in &skipped {
                    tracing::warn!(device = %key, property = %s.name, error = %s.error, "property skipped");
                }
                let config = Arc::new(config);
                match previous {
                    Some(running) => {
                        running.config.send_replace(config);
                        Some(running)
                    }
                    None => Some(self.start(config)),
                }
            }
            Err(error) => {
                tracing::warn!(device = %key, %error, "device not started: unusable protocol configData");
                drop(previous);
                let reporter = self.reporter.clone();
                let key = key.clone();
                tokio::spawn(async move { reporter.state(&key, DeviceState::Unhealthy).await });
                None
            }
        };
        inner.devices.insert(key, Entry { device, running });
    }

    fn start(&self, config: Arc<DeviceConfig>) -> Running {
        let (tx, rx) = watch::channel(config);
        let twins = TwinSnapshot::default();
        let task = tokio::spawn(run_device(rx, self.reporter.clone(), twins.clone()));
        Running {
            config: tx,
            twins,
            task,
        }
    }

    /// Stops and forgets a device; false if it was unknown.
    pub fn remove(&self, key: &DeviceKey) -> bool {
        self.lock().devices.remove(key).is_some()
    }

    /// The device as last received, with the twins last read.
    pub fn get(&self, key: &DeviceKey) -> Option<Device> {
        let inner = self.lock();
        let entry = inner.devices.get(key)?;
        let mut device = entry.device.clone();
        if let Some(running) = &entry.running {
            let twins = running.twins.lock().map(|t| t.clone()).unwrap_or_default();
            device
                .status
                .get_or_insert_with(DeviceStatus::default)
                .twins = twins;
        }
        Some(device)
    }

    pub fn device_keys(&self) -> Vec<DeviceKey> {
        let mut keys: Vec<_> = self.lock().devices.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Adds or replaces a model and re-derives the settings of the devices that use it
    /// (a model's `ReadOnly` access mode disables writes).
    pub fn upsert_model(&self, model: DeviceModel) {
        let key = (model.namespace.clone(), model.name.clone());
        let users = {
            let mut inner = self.lock();
            inner.models.insert(key.clone(), model);
            inner
                .devices
                .values()
                .filter(|e| {
                    e.device.namespace == key.0
                        && e.device
                            .spec
                            .as_ref()
                            .map(|s| s.device_model_reference.as_str())
                            == Some(key.1.as_str())
                })
                .map(|e| e.device.clone())
                .collect::<Vec<_>>()
        };
        for device in users {
            self.upsert(device);
        }
    }

    pub fn remove_model(&self, namespace: &str, name: &str) -> bool {
        self.lock()
            .models
            .remove(&(namespace.to_string(), name.to_string()))
            .is_some()
    }

    /// Stops every device task.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.devices.clear();
        inner.models.clear();
    }
}
