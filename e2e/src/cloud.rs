//! cloudcore's controllers and cloudhub in-process, against a test cluster.

use crate::channel::{Pki, test_hub_config};
use cloudcore::cloudhub::CloudHub;
use cloudcore::http::Readiness;
use cloudcore::metrics::HubMetrics;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub struct CloudFixture {
    pub hub: CloudHub,
    pub ready: Readiness,
    pub metrics: HubMetrics,
    shutdown: CancellationToken,
}

impl CloudFixture {
    /// Starts cloudhub and the edge controllers; returns once informers have synced.
    pub async fn start(client: kube::Client, pki: &Pki) -> anyhow::Result<CloudFixture> {
        let metrics = HubMetrics::default();
        // Simulated edges in these tests do not send keepalives on a timer.
        let mut config = test_hub_config();
        config.keepalive_interval = Duration::from_secs(120);
        let (hub, upstream) = CloudHub::bind(config, pki.server_tls()?, metrics.clone()).await?;
        let ready = Readiness::default();
        let shutdown = CancellationToken::new();
        tokio::spawn(cloudcore::controller::run(
            client,
            hub.clone(),
            upstream,
            ready.clone(),
            cloudcore::metrics::ControllerMetrics::default(),
            shutdown.clone(),
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !ready.is_ready() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "cloudcore informers did not sync"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(CloudFixture {
            hub,
            ready,
            metrics,
            shutdown,
        })
    }

    pub fn stop(&self) {
        self.shutdown.cancel();
        self.hub.shutdown();
    }
}

impl Drop for CloudFixture {
    fn drop(&mut self) {
        self.stop();
    }
}
