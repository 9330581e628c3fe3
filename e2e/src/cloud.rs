//! cloudcore's controllers and cloudhub in-process, against a test cluster.

use crate::channel::{Pki, test_hub_config};
use cloudcore::cloudhub::CloudHub;
use cloudcore::controller::SyncOptions;
use cloudcore::http::Readiness;
use cloudcore::leader::ElectionConfig;
use cloudcore::metrics::{ControllerMetrics, HubMetrics};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub struct CloudFixture {
    pub hub: CloudHub,
    /// The controllers' Services and EndpointSlices (what a cloudstream's relay checks).
    pub services: cloudcore::controller::ServiceCache,
    pub ready: Readiness,
    pub metrics: HubMetrics,
    pub controller_metrics: ControllerMetrics,
    shutdown: CancellationToken,
    controllers: Option<tokio::task::JoinHandle<()>>,
}

/// ObjectSync settings for tests: short intervals, and a Lease in `namespace` under a fresh
/// identity with short timings (taken over within ~3 s of a replica vanishing).
pub fn test_sync_options(namespace: &str) -> SyncOptions {
    SyncOptions {
        resync_interval: Duration::from_millis(500),
        crd_retry: Duration::from_millis(200),
        election: ElectionConfig {
            namespace: namespace.to_string(),
            identity: format!("cloudcore-test_{:08x}", rand::random::<u32>()),
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(200),
            ..SyncOptions::default().election
        },
        node_tasks: true,
        ..SyncOptions::default()
    }
}

impl CloudFixture {
    /// Starts cloudhub and the edge controllers; returns once informers have synced.
    pub async fn start(client: kube::Client, pki: &Pki) -> anyhow::Result<CloudFixture> {
        Self::start_with(client, pki, test_sync_options("default")).await
    }

    /// `start` with explicit ObjectSync (syncController) settings.
    pub async fn start_with(
        client: kube::Client,
        pki: &Pki,
        sync: SyncOptions,
    ) -> anyhow::Result<CloudFixture> {
        let fx = Self::launch(client, pki, sync).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !fx.ready.is_ready() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "cloudcore informers did not sync"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(fx)
    }

    /// Starts cloudhub and the edge controllers and returns at once, while the informers are
    /// still listing: edges may connect in that window, as they do after a real restart.
    pub async fn launch(
        client: kube::Client,
        pki: &Pki,
        sync: SyncOptions,
    ) -> anyhow::Result<CloudFixture> {
        let metrics = HubMetrics::default();
        // Simulated edges in these tests do not send keepalives on a timer.
        let mut config = test_hub_config();
        config.keepalive_interval = Duration::from_secs(120);
        let (hub, upstream) = CloudHub::bind(config, pki.server_tls()?, metrics.clone()).await?;
        let ready = Readiness::default();
        let shutdown = CancellationToken::new();
        let controller_metrics = ControllerMetrics::default();
        let (cm, token) = (controller_metrics.clone(), shutdown.clone());
        let services = cloudcore::controller::ServiceCache::default();
        let fixture_services = services.clone();
        let h = hub.clone();
        let r = ready.clone();
        let controllers = tokio::spawn(async move {
            let handles = cloudcore::controller::Handles {
                ready: r,
                metrics: cm,
                services,
            };
            cloudcore::controller::run_with(client, h, upstream, handles, &sync, token).await
        });
        Ok(CloudFixture {
            hub,
            services: fixture_services,
            ready,
            metrics,
            controller_metrics,
            shutdown,
            controllers: Some(controllers),
        })
    }

    pub fn stop(&self) {
        self.shutdown.cancel();
        self.hub.shutdown();
    }

    /// Stops and waits (up to 5 s) for the controllers to finish: their watches end before
    /// the API server they watch goes away.
    pub async fn shutdown(mut self) {
        self.stop();
        if let Some(c) = self.controllers.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), c).await;
        }
    }
}

impl Drop for CloudFixture {
    fn drop(&mut self) {
        self.stop();
    }
}
