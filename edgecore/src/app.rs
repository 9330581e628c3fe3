//! The edgecore process: configuration → TLS material → edge database → edgehub ⇄
//! metamanager ⇄ edged (the pod lifecycle over CRI, when `modules.edged.enable`). edged gets
//! a [`MetaClient`] for its reads and writes and the channel of [`ObjectChange`]s it acts on;
//! with edged disabled, [`EdgeCore::edged_link`] hands both out instead.

use crate::config::EdgeCoreConfig;
use crate::edged::{Edged, EdgedConfig};
use crate::edgehub::{EdgeHub, EdgeHubConfig};
use crate::metamanager::MetaManagerConfig;
use crate::metamanager::{MetaClient, MetaManager, MetaStore, ObjectChange, StoreError};
pub use crate::tls_files::load_tls;
use std::sync::Arc;
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
    Edged(#[from] crate::edged::EdgedError),
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
}

impl EdgeCore {
    /// Starts edgehub, the metamanager and (when `modules.edged.enable`) edged on a
    /// validated configuration.
    pub async fn start(config: &EdgeCoreConfig) -> Result<EdgeCore, StartError> {
        let edged = config
            .modules
            .edged
            .enable
            .then(|| EdgedConfig::from_edgecore(config));
        Self::start_with(config, edged).await
    }

    /// Like [`EdgeCore::start`], with edged's settings given (`None`: no edged), e.g. with
    /// timers a test shortens.
    pub async fn start_with(
        config: &EdgeCoreConfig,
        edged: Option<EdgedConfig>,
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
            crate::cri::socket_path(&e.runtime_endpoint)
                .map_err(|e| StartError::Edged(crate::edged::EdgedError::Runtime(e)))?;
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
        let (hub, from_cloud) = EdgeHub::start(EdgeHubConfig::from_edgecore(config), tls);
        let rotation = tokio_util::sync::CancellationToken::new();
        let edge_hub = &config.modules.edge_hub;
        if edge_hub.rotate_certificates && !edge_hub.http_server.is_empty() {
            crate::certmanager::spawn_rotation(config, hub.clone(), rotation.clone());
        }
        let (meta, client, changes) = MetaManager::start(
            MetaManagerConfig::from_edgecore(config),
            store.clone(),
            hub.clone(),
            from_cloud,
        );
        let status_reports = Arc::new(crate::edged::status_report::StatusReports::default());
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
                match Edged::start(e, client, changes, Some(hub.subscribe()), status_reports) {
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
        })
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
        if let Some(stream) = self.stream {
            stream.shutdown().await;
        }
        self.rotation.cancel();
        if let Some(edged) = self.running_edged {
            edged.shutdown().await;
        }
        self.meta.shutdown().await;
        self.hub.shutdown();
        self.store.close().await;
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
