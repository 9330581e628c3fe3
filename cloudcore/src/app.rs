//! Wiring of cloudcore's modules: certificates, cloudhub, controllers, metrics.

use crate::cloudhub::CloudHub;
use crate::config::CloudCoreConfig;
use crate::http::Readiness;
use crate::metrics::HubMetrics;
use anyhow::Context;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Builds a Kubernetes client from `kubeAPIConfig` (kubeconfig file, or in-cluster/env).
pub async fn kube_client(cfg: &CloudCoreConfig) -> anyhow::Result<kube::Client> {
    let k = &cfg.kube_api_config;
    let mut config = if k.kube_config.is_empty() {
        kube::Config::infer().await.context(
            "no kubeAPIConfig.kubeConfig set and no in-cluster/KUBECONFIG credentials found",
        )?
    } else {
        let kc = kube::config::Kubeconfig::read_from(&k.kube_config)
            .with_context(|| format!("reading kubeAPIConfig.kubeConfig {}", k.kube_config))?;
        kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .with_context(|| format!("using kubeconfig {}", k.kube_config))?
    };
    if !k.master.is_empty() {
        config.cluster_url = k
            .master
            .parse()
            .context("kubeAPIConfig.master is not a URL")?;
    }
    Ok(kube::Client::try_from(config)?)
}

/// Runs cloudcore until `shutdown` is cancelled.
pub async fn run(cfg: CloudCoreConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let client = kube_client(&cfg).await?;
    let hub_cfg = &cfg.modules.cloud_hub;
    let certs = crate::certs::prepare(Some(&client), hub_cfg).await?;

    let mut registry = Registry::default();
    let hub_metrics = HubMetrics::default();
    hub_metrics.register(&mut registry);
    let controller_metrics = crate::metrics::ControllerMetrics::default();
    controller_metrics.register(&mut registry);
    let registry = Arc::new(registry);
    let ready = Readiness::default();
    let monitor = &cfg.common_config.monitor_server.bind_address;
    if !monitor.is_empty() {
        crate::http::serve(
            monitor.parse()?,
            registry.clone(),
            ready.clone(),
            shutdown.clone(),
        )
        .await?;
    }

    let hub_config = cfg.hub_config()?;
    let listen = hub_config.listen;
    let (hub, upstream) = CloudHub::bind(hub_config, certs.server_tls()?, hub_metrics)
        .await
        .with_context(|| format!("cloudhub cannot listen on {listen}"))?;
    tracing::info!(addr = %hub.local_addr(), "cloudcore running; ready once informers sync");
    crate::controller::run_with(
        client,
        hub.clone(),
        upstream,
        ready,
        controller_metrics,
        &cfg.sync_options(),
        shutdown,
    )
    .await;
    hub.shutdown();
    Ok(())
}
