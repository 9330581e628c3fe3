//! Wiring of cloudcore's modules: certificates, cloudhub, controllers, metrics.

use crate::cloudhub::CloudHub;
use crate::config::{CloudCoreConfig, IptablesMode};
use crate::http::Readiness;
use crate::metrics::HubMetrics;
use anyhow::Context;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Builds a Kubernetes client from `kubeAPIConfig` (kubeconfig file, or in-cluster/env).
pub async fn kube_client(cfg: &CloudCoreConfig) -> anyhow::Result<kube::Client> {
    Ok(kube::Client::try_from(kube_config(cfg).await?)?)
}

/// The same client, its requests counted in `metrics` (`/metrics`:
/// `cloudcore_apiserver_requests_total` and the bytes).
pub(crate) async fn counted_kube_client(
    cfg: &CloudCoreConfig,
    metrics: crate::apiserver_requests::ApiRequestMetrics,
) -> anyhow::Result<kube::Client> {
    let layer = crate::apiserver_requests::CountRequests(metrics);
    Ok(
        kube::client::ClientBuilder::try_from(kube_config(cfg).await?)?
            .with_layer(&layer)
            .build(),
    )
}

async fn kube_config(cfg: &CloudCoreConfig) -> anyhow::Result<kube::Config> {
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
    Ok(config)
}

/// The join token in Secret `kubeedge/tokensecret` and the certificate server on
/// `cloudHub.https` (protocol §6.2, §6.3).
async fn start_join(
    client: &kube::Client,
    hub: &crate::config::CloudHubConfig,
    certs: &crate::certs::HubCerts,
    metrics: crate::join::JoinMetrics,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    use crate::join::server::{self, JoinServer};
    let ca = Arc::new(kubeedge_shared::pki::CertificateAuthority::from_der(
        &certs.ca.cert.cert_der,
        &certs.ca.key_der,
    )?);
    let refresh = std::time::Duration::from_secs(hub.token_refresh_duration.max(1) * 3600);
    tokio::spawn(crate::join::token_secret::run(
        client.clone(),
        ca.clone(),
        refresh,
        metrics.clone(),
        shutdown.clone(),
    ));
    if !hub.https.enable {
        tracing::info!("cloudHub.https is disabled: edges cannot join with a token");
        return Ok(());
    }
    let ip: std::net::IpAddr = hub.https.address.parse().with_context(|| {
        format!(
            "cloudHub.https.address {:?} is not an IP",
            hub.https.address
        )
    })?;
    let tls = server::tls_config(
        &ca,
        certs.server_chain.clone(),
        certs.server_key.clone_key(),
    )?;
    let join = Arc::new(JoinServer {
        ca,
        signing_days: hub.edge_cert_signing_duration.max(1) as i64,
        allow_legacy_certificates: hub.allow_legacy_certificates,
        metrics,
    });
    server::serve((ip, hub.https.port).into(), tls, join, shutdown.clone()).await?;
    Ok(())
}

/// Runs cloudcore until `shutdown` is cancelled.
pub async fn run(cfg: CloudCoreConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let api_metrics = crate::apiserver_requests::ApiRequestMetrics::default();
    api_metrics.register(&mut registry);
    let client = counted_kube_client(&cfg, api_metrics).await?;
    let hub_cfg = &cfg.modules.cloud_hub;
    let certs = crate::certs::prepare(Some(&client), hub_cfg).await?;

    let hub_metrics = HubMetrics::default();
    hub_metrics.register(&mut registry);
    let controller_metrics = crate::metrics::ControllerMetrics::default();
    controller_metrics.register(&mut registry);
    let join_metrics = crate::join::JoinMetrics::default();
    join_metrics.register(&mut registry);
    let stream_metrics = crate::metrics::StreamMetrics::default();
    stream_metrics.register(&mut registry);
    let router_metrics = crate::router::RouterMetrics::default();
    if cfg.modules.router.enable {
        router_metrics.register(&mut registry);
    }
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

    start_join(&client, hub_cfg, &certs, join_metrics, &shutdown).await?;

    let hub_config = crate::cloudhub::HubConfig::from_cloudcore(&cfg)?;
    let listen = hub_config.listen;
    let (hub, upstream) = CloudHub::bind(hub_config, certs.server_tls()?, hub_metrics)
        .await
        .with_context(|| format!("cloudhub cannot listen on {listen}"))?;
    let services = crate::controller::services::ServiceCache::default();
    let _stream = if cfg.modules.cloud_stream.enable {
        // As KubeEdge's NegotiateTunnelPort: this replica's port for its own address.
        let ip = crate::cloudstream::tunnel_port::local_ip();
        let tunnel_port = crate::cloudstream::tunnel_port::negotiate(&client, &ip)
            .await
            .context("negotiating the tunnel port (commonConfig.tunnelPort)")?;
        start_iptables_manager(&cfg, &client, &shutdown);
        Some(
            start_stream(
                &cfg,
                &certs,
                client.clone(),
                tunnel_port,
                stream_metrics,
                Arc::new(services.clone()),
            )
            .await?,
        )
    } else {
        None
    };
    let _router = if cfg.modules.router.enable {
        let settings = crate::router::RouterSettings::from_cloudcore(&cfg)?;
        Some(
            crate::router::Router::start(
                settings,
                client.clone(),
                hub.clone(),
                router_metrics,
                shutdown.clone(),
            )
            .await?,
        )
    } else {
        None
    };
    tracing::info!(addr = %hub.local_addr(), "cloudcore running; ready once informers sync");
    crate::controller::run_with(
        client,
        hub.clone(),
        upstream,
        crate::controller::Handles {
            ready,
            metrics: controller_metrics,
            services,
        },
        &crate::controller::objectsync::SyncOptions::from_cloudcore(&cfg),
        shutdown,
    )
    .await;
    hub.shutdown();
    Ok(())
}

/// `modules.iptablesManager` with `enable` and mode `internal` (KubeEdge's default): the DNAT
/// rules for every replica's tunnel port, installed from this process (hostNetwork and
/// NET_ADMIN needed). Mode `external` leaves them to `cloudcore iptables-manager`
/// ([`run_iptables_manager`]) or KubeEdge's iptables-manager.
fn start_iptables_manager(
    cfg: &CloudCoreConfig,
    client: &kube::Client,
    shutdown: &CancellationToken,
) {
    let m = &cfg.modules.iptables_manager;
    if !m.enable || m.mode != IptablesMode::Internal {
        tracing::info!(enable = m.enable, mode = %m.mode, "iptables manager not run in cloudcore");
        return;
    }
    tokio::spawn(crate::cloudstream::iptables::run(
        client.clone(),
        crate::cloudstream::iptables::Iptables::default(),
        cfg.modules.cloud_stream.stream_port,
        IPTABLES_SYNC_PERIOD,
        shutdown.clone(),
    ));
}

const IPTABLES_SYNC_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// `cloudcore iptables-manager`: only the iptables manager, as KubeEdge's iptables-manager
/// DaemonSet for mode `external` (one per cloud node, hostNetwork, NET_ADMIN), with the
/// stream port and API access of the same cloudcore.yaml. Runs until `shutdown`.
pub async fn run_iptables_manager(
    cfg: CloudCoreConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let client = kube_client(&cfg).await?;
    let m = &cfg.modules.iptables_manager;
    if !(m.enable && m.mode == IptablesMode::External) {
        tracing::warn!(enable = m.enable, mode = %m.mode, "running the iptables manager standalone although the config does not ask for mode external");
    }
    let stream_port = cfg.modules.cloud_stream.stream_port;
    tracing::info!(stream_port, "iptables manager running");
    crate::cloudstream::iptables::run(
        client,
        crate::cloudstream::iptables::Iptables::default(),
        stream_port,
        IPTABLES_SYNC_PERIOD,
        shutdown,
    )
    .await;
    Ok(())
}

/// cloudstream on `streamPort`/`tunnelPort` of all addresses, with the tunnel certificate
/// from `tlsTunnelCertFile`/`tlsTunnelPrivateKeyFile` when both exist, else cloudhub's; the
/// stream server's from `tlsStreamCertFile`/`tlsStreamPrivateKeyFile` when both exist (made
/// with `cloudcore stream-certificate`), else the tunnel's; and clients of the stream server
/// verified against the stream CA (`tlsStreamCAFile`, else the service-account CA).
async fn start_stream(
    cfg: &CloudCoreConfig,
    certs: &crate::certs::HubCerts,
    client: kube::Client,
    tunnel_port: u16,
    metrics: crate::metrics::StreamMetrics,
    relay_targets: Arc<dyn crate::cloudstream::mesh_relay::RelayTargets>,
) -> anyhow::Result<crate::cloudstream::CloudStream> {
    use crate::cloudstream::certificate::ServerIdentity;
    use crate::cloudstream::client_auth;
    use std::path::Path;
    let s = &cfg.modules.cloud_stream;
    let tunnel = ServerIdentity::load(
        Path::new(&s.tls_tunnel_cert_file),
        Path::new(&s.tls_tunnel_private_key_file),
    )
    .context("modules.cloudStream.tlsTunnelCertFile/tlsTunnelPrivateKeyFile")?;
    let (chain, key) = match tunnel {
        Some(id) => (id.chain, id.key),
        None => (certs.server_chain.clone(), certs.server_key.clone_key()),
    };
    let stream_cert = ServerIdentity::load(
        Path::new(&s.tls_stream_cert_file),
        Path::new(&s.tls_stream_private_key_file),
    )
    .context("modules.cloudStream.tlsStreamCertFile/tlsStreamPrivateKeyFile")?;
    match &stream_cert {
        Some(_) => {
            tracing::info!(cert = %s.tls_stream_cert_file, "stream server certificate from tlsStreamCertFile")
        }
        None => tracing::info!(
            "no {}: the stream server presents the tunnel certificate (an apiserver with \
             --kubelet-certificate-authority refuses it; see `cloudcore stream-certificate`)",
            s.tls_stream_cert_file
        ),
    }
    let client_auth = client_auth::select(
        Path::new(&s.tls_stream_ca_file),
        Path::new(client_auth::SERVICE_ACCOUNT_CA),
        s.insecure_skip_client_verify,
    )
    .context("cloudstream's client CA")?;
    let any = std::net::IpAddr::from([0, 0, 0, 0]);
    let settings = crate::cloudstream::StreamSettings {
        stream_listen: (any, s.stream_port).into(),
        tunnel_listen: (any, s.tunnel_port).into(),
        chain,
        key,
        stream_cert,
        ca: vec![certs.ca.cert.cert_der.clone()],
        allow_legacy_cn: cfg.modules.cloud_hub.allow_legacy_certificates,
        node_port: Some(tunnel_port),
        client_auth,
        metrics,
        relay_targets: Some(relay_targets),
    };
    crate::cloudstream::CloudStream::start(settings, client)
        .await
        .context("starting cloudstream")
}
