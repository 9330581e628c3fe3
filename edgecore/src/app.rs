//! The edgecore process: configuration → TLS material → edge database → edgehub ⇄
//! metamanager ⇄ edged (the pod lifecycle over CRI, when `modules.edged.enable`). edged gets
//! a [`MetaClient`] for its reads and writes and the channel of [`ObjectChange`]s it acts on;
//! with edged disabled, [`EdgeCore::edged_link`] hands both out instead.

use crate::config::EdgeCoreConfig;
use crate::devicetwin::{BusMessage, DeviceTwin, DeviceTwinConfig};
use crate::edgehub::Routes;
use crate::edgehub::{EdgeHub, EdgeHubConfig};
use crate::eventbus::{BusSinks, EventBus, EventBusConfig};
use crate::metamanager::MetaManagerConfig;
use crate::metamanager::{
    DeviceObject, MetaClient, MetaManager, MetaStore, ObjectChange, StoreError,
};
pub use crate::tls_files::load_tls;
use kubeedge_edged::{Edged, EdgedConfig};
use kubeedge_shared::{Group, Message, Operation};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Tls(#[from] crate::tls_files::TlsFileError),
    #[error(transparent)]
    Stream(#[from] crate::edgestream::EdgeStreamError),
    #[error(
        "cannot open the edge database (database.dataSource = {path}): {source}\n  \
         Check the directory exists and is writable, and that no other edgecore uses the file."
    )]
    Database { path: String, source: StoreError },
    #[error("{0}")]
    Unsupported(String),
    #[error("joining the cloud: {0}")]
    Join(#[from] crate::certmanager::CertError),
    #[error("cannot start edged: {0}")]
    Edged(#[from] kubeedge_edged::EdgedError),
    #[error("cannot start devicetwin: {0}")]
    DeviceTwin(#[from] crate::devicetwin::DeviceTwinError),
    #[error("cannot start the eventbus: {0}")]
    EventBus(#[from] crate::eventbus::EventBusError),
    #[error("cannot start the MetaServer: {0}")]
    MetaServer(#[from] crate::metaserver::MetaServerError),
    #[error("cannot start edgemesh (modules.edgeMesh): {0}")]
    Mesh(#[from] kubeedge_edgemesh::mesh::MeshError),
    #[error("cannot start the servicebus: {0}")]
    ServiceBus(#[from] crate::servicebus::ServiceBusError),
}

/// The running edge: edgehub, the database and the metamanager.
pub struct EdgeCore {
    hub: EdgeHub,
    store: MetaStore,
    meta: MetaManager,
    edged: Option<(MetaClient, mpsc::Receiver<ObjectChange>)>,
    running_edged: Option<Edged>,
    /// Stops certificate rotation.
    rotation: tokio_util::sync::CancellationToken,
    stream: Option<crate::edgestream::EdgeStream>,
    devices: Option<Devices>,
    metaserver: Option<crate::metaserver::MetaServer>,
    mesh: Option<crate::mesh::Mesh>,
    servicebus: Option<crate::servicebus::ServiceBus>,
    tasks: Option<tokio::task::JoinHandle<()>>,
}

/// devicetwin and the eventbus, when enabled.
struct Devices {
    twin: DeviceTwin,
    bus: Option<EventBus>,
}

impl EdgeCore {
    /// Starts edgehub, the metamanager and (when `modules.edged.enable`) edged on a
    /// validated configuration.
    pub async fn start(config: &EdgeCoreConfig) -> Result<EdgeCore, StartError> {
        let edged = config
            .modules
            .edged
            .enable
            .then(|| crate::edged_config::edged_config(config));
        Self::start_with(config, edged).await
    }

    /// Like [`EdgeCore::start`], with edged's settings given (`None`: no edged), e.g. with
    /// timers a test shortens.
    pub async fn start_with(
        config: &EdgeCoreConfig,
        edged: Option<EdgedConfig>,
    ) -> Result<EdgeCore, StartError> {
        Self::start_full(config, edged, None).await
    }

    /// Starts edgecore as its binary does: from the file at `config_path`, which node tasks
    /// may update, with restarts requested through the returned `Supervisor`.
    pub async fn start_supervised(
        config: &EdgeCoreConfig,
        config_path: &std::path::Path,
    ) -> Result<(EdgeCore, Arc<crate::taskmanager::Supervisor>), StartError> {
        let supervisor = Arc::new(crate::taskmanager::Supervisor {
            config_path: Some(config_path.to_path_buf()),
            exe: std::env::current_exe().ok(),
            ..Default::default()
        });
        let edged = config
            .modules
            .edged
            .enable
            .then(|| crate::edged_config::edged_config(config));
        let edge = Self::start_full(config, edged, Some(supervisor.clone())).await?;
        Ok((edge, supervisor))
    }

    async fn start_full(
        config: &EdgeCoreConfig,
        edged: Option<EdgedConfig>,
        supervisor: Option<Arc<crate::taskmanager::Supervisor>>,
    ) -> Result<EdgeCore, StartError> {
        if !config.modules.edge_hub.enable {
            return Err(StartError::Unsupported(
                "modules.edgeHub.enable is false: kubeedge-rs edgecore needs its cloud link".into(),
            ));
        }
        if !config.modules.meta_manager.enable {
            return Err(StartError::Unsupported(
                "modules.metaManager.enable is false: kubeedge-rs edgecore needs its database"
                    .into(),
            ));
        }
        if let Some(e) = &edged {
            kubeedge_edged::cri::socket_path(&e.runtime_endpoint)
                .map_err(|e| StartError::Edged(kubeedge_edged::EdgedError::Runtime(e)))?;
        }
        let tls = load_tls(config)?;
        let path = &config.database.data_source;
        let store = MetaStore::open(path)
            .await
            .map_err(|source| StartError::Database {
                path: path.clone(),
                source,
            })?;
        tracing::info!(database = %path, node = %config.node_name(), server = %config.modules.edge_hub.websocket.server, "edgecore starting");
        // edgehub dials once every module that takes cloud messages runs (`routing.serve`).
        let (hub, routing) = EdgeHub::start_routed(EdgeHubConfig::from_edgecore(config), tls);
        let rotation = tokio_util::sync::CancellationToken::new();
        let edge_hub = &config.modules.edge_hub;
        if edge_hub.rotate_certificates && !edge_hub.http_server.is_empty() {
            crate::certmanager::spawn_rotation(config, hub.clone(), rotation.clone());
        }
        let module_metrics = Arc::new(crate::module_metrics::ModuleMetrics::default());
        let (devices, device_inputs) =
            match start_devices(config, &store, &hub, &module_metrics).await {
                Ok(d) => d,
                Err(e) => {
                    hub.shutdown();
                    store.close().await;
                    return Err(e);
                }
            };
        let servicebus = match start_servicebus(config, &store, &hub, &module_metrics).await {
            Ok(s) => s,
            Err(e) => {
                hub.shutdown();
                store.close().await;
                return Err(e);
            }
        };
        // Node tasks (`modules.taskManager.enable`, off by default as in KubeEdge).
        let (task_tx, task_rx) = mpsc::channel(16);
        let tasks_on = config.modules.task_manager.enable;
        // The MetaServer's `unhold-upgrade` releases the pods edged holds.
        let (releaser, releases) = kubeedge_edged::hold::channel();
        let (confirm_hook, confirms) = match supervisor.as_deref().filter(|_| tasks_on) {
            Some(sup) => crate::taskmanager::confirmations(sup).unzip(),
            None => (None, None),
        };
        // Before the metamanager writes anything, so that the watch history misses nothing.
        let metaserver = match crate::metaserver::MetaServerConfig::from_edgecore(config)
            .map_err(StartError::Unsupported)
        {
            Ok(Some(mut ms)) => {
                ms.held_pods = edged.is_some().then_some(releaser);
                ms.confirm_upgrade = confirm_hook.map(crate::metaserver::ConfirmHook);
                match crate::metaserver::MetaServer::start(ms, store.clone(), hub.clone()).await {
                    Ok(s) => Some(s),
                    Err(e) => {
                        hub.shutdown();
                        store.close().await;
                        return Err(e.into());
                    }
                }
            }
            Ok(None) => None,
            Err(e) => {
                hub.shutdown();
                store.close().await;
                return Err(e);
            }
        };
        // Endpoints on other nodes are relayed by the cloud's tunnel port (edgestream's TLS).
        let dialer: Option<Arc<dyn kubeedge_edgemesh::proxy::relay::RelayDialer>> =
            match (&edged, config.modules.edge_stream.enable) {
                (Some(e), true) => crate::edgestream::EdgeStream::relay_dialer(config, e)
                    .ok()
                    .map(|d| Arc::new(d) as _),
                _ => None,
            };
        let mesh = match (crate::mesh::mesh_config(config), &metaserver) {
            (Ok(Some(mc)), Some(ms)) => crate::mesh::Mesh::start(mc, ms, dialer, true)
                .await
                .map(Some)
                .map_err(StartError::from),
            (Err(e), _) => Err(StartError::Unsupported(e)),
            _ => Ok(None),
        };
        let mesh = match mesh {
            Ok(m) => m,
            Err(e) => {
                if let Some(ms) = metaserver {
                    ms.shutdown().await;
                }
                hub.shutdown();
                store.close().await;
                return Err(e);
            }
        };
        if let Some(m) = &mesh {
            module_metrics.register(|r| m.edgemesh().register_metrics(r));
        }
        let (to_meta, from_cloud) = mpsc::channel(hub.inbound_capacity());
        let (meta, client, changes) = MetaManager::start_with_devices(
            MetaManagerConfig::from_edgecore(config),
            store.clone(),
            hub.clone(),
            from_cloud,
            device_inputs.objects,
        );
        routing.serve(Routes {
            meta: to_meta,
            twin: device_inputs.twin,
            bus: device_inputs.bus,
            servicebus: servicebus.as_ref().map(|s| s.sender()),
            tasks: tasks_on.then_some(task_tx),
        });
        crate::taskmanager::resume_pending(supervisor.as_ref(), &hub);
        let tasks = tasks_on.then(|| {
            let (endpoint, request, pull) = match &edged {
                Some(e) => (
                    e.runtime_endpoint.clone(),
                    e.runtime_request_timeout,
                    e.image_pull_timeout,
                ),
                None => (
                    String::new(),
                    Duration::from_secs(120),
                    Duration::from_secs(600),
                ),
            };
            crate::taskmanager::spawn(
                crate::taskmanager::TaskSettings {
                    node_name: config.node_name().to_string(),
                    runtime_endpoint: endpoint,
                    runtime_request_timeout: request,
                    image_pull_timeout: pull,
                    supervisor: supervisor.clone(),
                },
                task_rx,
                confirms,
                hub.clone(),
                client.clone(),
            )
        });
        let status_reports = Arc::new(kubeedge_edged::status_report::StatusReports::default());
        status_reports.attach(module_metrics);
        let stream = match (&edged, config.modules.edge_stream.enable) {
            (Some(e), true) => {
                match crate::edgestream::EdgeStream::from_config(config, e, status_reports.clone())
                {
                    Ok(s) => Some(s),
                    Err(err) => {
                        meta.shutdown().await;
                        hub.shutdown();
                        store.close().await;
                        return Err(err.into());
                    }
                }
            }
            _ => None,
        };
        let (link, running_edged) = match edged {
            Some(e) => {
                let observer = mesh.as_ref().map(|m| m.pod_observer());
                match Edged::start(
                    e,
                    client,
                    changes,
                    Some(kubeedge_edged::EdgedLink {
                        events: hub.subscribe(),
                        terms: hub.terms(),
                    }),
                    status_reports,
                    observer,
                    releases,
                ) {
                    Ok(running) => (None, Some(running)),
                    Err(err) => {
                        meta.shutdown().await;
                        hub.shutdown();
                        store.close().await;
                        return Err(err.into());
                    }
                }
            }
            None => (Some((client, changes)), None),
        };
        Ok(EdgeCore {
            hub,
            store,
            meta,
            edged: link,
            running_edged,
            rotation,
            stream,
            devices,
            metaserver,
            mesh,
            servicebus,
            tasks,
        })
    }

    /// The MetaServer's address, when it runs.
    pub fn metaserver_addr(&self) -> Option<std::net::SocketAddr> {
        self.metaserver.as_ref().map(|m| m.local_addr())
    }

    /// edgemesh, when it runs.
    pub fn mesh(&self) -> Option<&kubeedge_edgemesh::mesh::EdgeMesh> {
        self.mesh.as_ref().map(|m| m.edgemesh())
    }

    /// Events and bytes in the MetaServer's watch history, when it runs.
    pub fn metaserver_history(&self) -> Option<(usize, usize)> {
        self.metaserver.as_ref().map(|m| m.history_size())
    }

    /// What edged needs: the client and the channel of database changes, when edged is not
    /// running inside this edgecore. `None` after the first call (and with edged running).
    pub fn edged_link(&mut self) -> Option<(MetaClient, mpsc::Receiver<ObjectChange>)> {
        self.edged.take()
    }

    pub fn hub(&self) -> &EdgeHub {
        &self.hub
    }

    /// Stops edged (pods keep running), the metamanager (letting writes in progress
    /// finish), the cloud link and the database, in that order.
    pub async fn shutdown(self) {
        if let Some(m) = self.mesh {
            m.shutdown().await;
        }
        if let Some(ms) = self.metaserver {
            ms.shutdown().await;
        }
        if let Some(stream) = self.stream {
            stream.shutdown().await;
        }
        self.rotation.cancel();
        if let Some(edged) = self.running_edged {
            edged.shutdown().await;
        }
        self.meta.shutdown().await;
        if let Some(sb) = self.servicebus {
            sb.shutdown().await;
        }
        if let Some(t) = self.tasks {
            t.abort();
        }
        if let Some(d) = self.devices {
            d.twin.shutdown().await;
            if let Some(bus) = d.bus {
                bus.shutdown().await;
            }
        }
        self.hub.shutdown();
        self.store.close().await;
    }
}

/// Where the device modules take their inputs: devicetwin the cloud's `twin` messages and the
/// devices metamanager stored, the eventbus the router's operations (none: not running).
#[derive(Default)]
struct DeviceInputs {
    twin: Option<mpsc::Sender<Message>>,
    objects: Option<mpsc::Sender<DeviceObject>>,
    bus: Option<mpsc::Sender<Message>>,
}

/// Starts devicetwin (`modules.deviceTwin.enable`) and the eventbus (`modules.eventBus.enable`)
/// between MQTT and devicetwin; messages on other topics go to the cloud as KubeEdge's
/// `upload`.
async fn start_devices(
    config: &EdgeCoreConfig,
    store: &MetaStore,
    hub: &EdgeHub,
    metrics: &crate::module_metrics::ModuleMetrics,
) -> Result<(Option<Devices>, DeviceInputs), StartError> {
    if !config.modules.device_twin.enable {
        return Ok((None, DeviceInputs::default()));
    }
    let (publish_tx, mut publish_rx) = mpsc::channel::<BusMessage>(1024);
    let (twin, inputs) = DeviceTwin::start(
        DeviceTwinConfig::from_edgecore(config),
        store.clone(),
        hub.clone(),
        publish_tx,
    )
    .await?;
    metrics.register(|r| twin.metrics().register(r));
    if !config.modules.event_bus.enable {
        tokio::spawn(async move {
            while let Some(m) = publish_rx.recv().await {
                tracing::debug!(topic = %m.topic, "eventbus disabled; MQTT message not published");
            }
        });
        let routes = DeviceInputs {
            twin: Some(inputs.cloud),
            objects: Some(inputs.objects),
            bus: None,
        };
        return Ok((Some(Devices { twin, bus: None }), routes));
    }
    let (cloud_tx, mut cloud_rx) = mpsc::channel::<BusMessage>(1024);
    let sinks = BusSinks {
        twin: inputs.bus.clone(),
        cloud: cloud_tx,
    };
    let bus = match EventBus::start(
        EventBusConfig::from_edgecore(config),
        Some(store.clone()),
        sinks,
    )
    .await
    {
        Ok(b) => b,
        Err(e) => {
            twin.shutdown().await;
            return Err(e.into());
        }
    };
    metrics.register(|r| bus.metrics().register(r));
    let publisher = bus.clone();
    tokio::spawn(async move {
        while let Some(m) = publish_rx.recv().await {
            if let Err(e) = publisher.publish(&m.topic, m.payload) {
                tracing::warn!(topic = %m.topic, error = %e, "MQTT message not published");
            }
        }
    });
    let link = hub.clone();
    tokio::spawn(async move {
        while let Some(m) = cloud_rx.recv().await {
            let content =
                serde_json::Value::String(String::from_utf8_lossy(&m.payload).into_owned());
            let msg = Message::new(
                kubeedge_shared::operation::source::EVENTBUS,
                Group::User,
                Operation::Upload,
                m.topic.clone(),
                content,
            );
            if let Err(e) = link.send(msg).await {
                tracing::debug!(topic = %m.topic, error = %e, "MQTT upload not sent to the cloud");
            }
        }
    });
    let (ops_tx, mut ops_rx) = mpsc::channel::<Message>(256);
    let node = config.node_name().to_string();
    let ops_bus = bus.clone();
    tokio::spawn(async move {
        while let Some(m) = ops_rx.recv().await {
            apply_cloud_op(&ops_bus, &node, &m).await;
        }
    });
    let routes = DeviceInputs {
        twin: Some(inputs.cloud),
        objects: Some(inputs.objects),
        bus: Some(ops_tx),
    };
    Ok((
        Some(Devices {
            twin,
            bus: Some(bus),
        }),
        routes,
    ))
}

/// The servicebus (`modules.serviceBus.enable`, off by default as in KubeEdge): the cloud
/// router's calls of this node's HTTP servers and its applications' calls of cloud endpoints.
async fn start_servicebus(
    config: &EdgeCoreConfig,
    store: &MetaStore,
    hub: &EdgeHub,
    metrics: &crate::module_metrics::ModuleMetrics,
) -> Result<Option<crate::servicebus::ServiceBus>, StartError> {
    if !config.modules.service_bus.enable {
        return Ok(None);
    }
    let settings = crate::servicebus::ServiceBusConfig::from_edgecore(config)
        .map_err(StartError::Unsupported)?;
    let sb = crate::servicebus::ServiceBus::start(settings, store.clone(), hub.clone()).await?;
    metrics.register(|r| sb.metrics().register(r));
    Ok(Some(sb))
}

/// A router operation from the cloud, on the bus.
async fn apply_cloud_op(bus: &EventBus, node: &str, m: &Message) {
    use crate::eventbus::cloud_ops::{BusOp, plan};
    let result = match plan(node, m) {
        Ok(BusOp::Subscribe(t)) => bus.subscribe(&t).await.map_err(|e| e.to_string()),
        Ok(BusOp::Unsubscribe(t)) => bus.unsubscribe(&t).await.map_err(|e| e.to_string()),
        Ok(BusOp::Publish { topic, payload }) => {
            bus.publish(&topic, payload).map_err(|e| e.to_string())
        }
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        tracing::warn!(operation = %m.route.operation, resource = %m.route.resource, error = %e,
            "router message for the eventbus not applied");
    }
}

/// With edged disabled, the changes it would act on are logged (they are in the database,
/// where edged finds them when it starts).
pub async fn log_changes_without_edged(mut changes: mpsc::Receiver<ObjectChange>) {
    while let Some(c) = changes.recv().await {
        tracing::info!(kind = ?c.kind, action = ?c.action, key = %c.key,
            "stored; edged is disabled, nothing acts on it");
    }
}
