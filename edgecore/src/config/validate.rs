//! [`EdgeCoreConfig::validate`]: every invalid value with its path and the reason.

use super::*;
use kubeedge_shared::config::Problems;
use kubeedge_shared::names::validate_node_name;

impl EdgeCoreConfig {
    /// Every invalid value, with its path and the reason.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let mut problems = Problems::default();
        if self.kind != KIND {
            problems.bad("kind", format!("must be {KIND:?}, got {:?}", self.kind));
        }
        if !self.api_version.starts_with("edgecore.config.kubeedge.io/") {
            problems.bad(
                "apiVersion",
                format!("must be {API_VERSION:?}, got {:?}", self.api_version),
            );
        } else if self.api_version != API_VERSION {
            problems.bad(
                "apiVersion",
                format!(
                    "only {API_VERSION} is supported, got {:?} (regenerate the file with `edgecore --defaultconfig`)",
                    self.api_version
                ),
            );
        }
        if self.database.driver_name != "sqlite3" {
            problems.bad(
                "database.driverName",
                format!("must be \"sqlite3\", got {:?}", self.database.driver_name),
            );
        }
        if self.database.data_source.is_empty() {
            problems.bad("database.dataSource", "must not be empty");
        }

        let mesh = &self.modules.edge_mesh;
        if mesh.enable {
            if mesh.listen_address.parse::<std::net::Ipv4Addr>().is_err() {
                problems.bad(
                    "modules.edgeMesh.listenAddress",
                    format!(
                        "{:?} is not an IPv4 address (e.g. 169.254.96.16)",
                        mesh.listen_address
                    ),
                );
            }
            if mesh.dns.enable && mesh.dns.port == 0 {
                problems.bad("modules.edgeMesh.dns.port", "must be 1–65535");
            }
            for (i, u) in mesh.dns.upstream_servers.iter().enumerate() {
                if crate::mesh::parse_upstream(u).is_err() {
                    problems.bad(
                        &format!("modules.edgeMesh.dns.upstreamServers[{i}]"),
                        format!("{u:?} is not an IP address or IP:port"),
                    );
                }
            }
            let p = &mesh.proxy;
            if p.enable {
                let prefix_ok = !p.chain_prefix.is_empty()
                    && p.chain_prefix.len() <= 6
                    && p.chain_prefix
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
                if !prefix_ok {
                    problems.bad(
                        "modules.edgeMesh.proxy.chainPrefix",
                        format!(
                            "{:?} must be 1–6 upper-case letters or digits (e.g. KE)",
                            p.chain_prefix
                        ),
                    );
                }
                for (i, c) in p.direct_cidrs.iter().enumerate() {
                    if let Err(e) = kubeedge_edgemesh::proxy::rules::Cidr::parse(c) {
                        problems.bad(&format!("modules.edgeMesh.proxy.directCIDRs[{i}]"), e);
                    }
                }
            }
        }

        let hub = &self.modules.edge_hub;
        if hub.enable {
            problems.positive("modules.edgeHub.heartbeat", hub.heartbeat);
            problems.non_negative("modules.edgeHub.messageQPS", hub.message_qps);
            problems.non_negative("modules.edgeHub.messageBurst", hub.message_burst);
            if hub.quic.enable {
                problems.bad(
                    "modules.edgeHub.quic.enable",
                    "QUIC (KubeEdge's gQUIC) is not supported; use websocket",
                );
            }
            if !hub.websocket.enable {
                problems.bad(
                    "modules.edgeHub.websocket.enable",
                    "must be true (the WebSocket is the only supported transport)",
                );
            }
            let ws = &hub.websocket;
            problems.positive(
                "modules.edgeHub.websocket.handshakeTimeout",
                ws.handshake_timeout,
            );
            problems.positive("modules.edgeHub.websocket.writeDeadline", ws.write_deadline);
            problems.non_negative("modules.edgeHub.websocket.readDeadline", ws.read_deadline);
            if kubeedge_shared::net::split_server(&ws.server).is_none() {
                problems.bad(
                    "modules.edgeHub.websocket.server",
                    format!("{:?} is not host:port (e.g. 192.168.1.10:10000)", ws.server),
                );
            }
            if hub.project_id.is_empty() {
                problems.bad("modules.edgeHub.projectID", "must not be empty");
            }
            for (path, file) in [
                ("modules.edgeHub.tlsCaFile", &hub.tls_ca_file),
                ("modules.edgeHub.tlsCertFile", &hub.tls_cert_file),
                (
                    "modules.edgeHub.tlsPrivateKeyFile",
                    &hub.tls_private_key_file,
                ),
            ] {
                if file.is_empty() {
                    problems.bad(path, "must not be empty");
                }
            }
            if !hub.http_server.is_empty() && !hub.http_server.starts_with("https://") {
                problems.bad(
                    "modules.edgeHub.httpServer",
                    format!("must be an https:// URL, got {:?}", hub.http_server),
                );
            }
        }

        let edged = &self.modules.edged;
        if let Err(reason) = validate_node_name(&edged.hostname_override) {
            problems.bad("modules.edged.hostnameOverride", reason);
        }
        if edged.register_node_namespace.is_empty() {
            problems.bad("modules.edged.registerNodeNamespace", "must not be empty");
        }
        if !edged.node_ip.is_empty() && edged.node_ip.parse::<std::net::IpAddr>().is_err() {
            problems.bad(
                "modules.edged.nodeIP",
                format!("not an IP address: {:?}", edged.node_ip),
            );
        }
        if edged.enable {
            if edged.container_runtime != "remote" {
                problems.bad(
                    "modules.edged.containerRuntime",
                    format!(
                        "must be \"remote\" (a CRI runtime), got {:?}",
                        edged.container_runtime
                    ),
                );
            }
            if edged.remote_runtime_endpoint.is_empty() {
                problems.bad("modules.edged.remoteRuntimeEndpoint", "must not be empty");
            }
            let k = &edged.tailored_kubelet_config;
            let p = "modules.edged.tailoredKubeletConfig";
            if !(0..=65535).contains(&k.read_only_port) {
                problems.bad(
                    &format!("{p}.readOnlyPort"),
                    format!("must be between 0 and 65535, got {}", k.read_only_port),
                );
            }
            problems.positive(
                &format!("{p}.nodeLeaseDurationSeconds"),
                k.node_lease_duration_seconds,
            );
            problems.non_negative(&format!("{p}.maxPods"), k.max_pods);
            for (name, d) in [
                ("nodeStatusUpdateFrequency", k.node_status_update_frequency),
                ("nodeStatusReportFrequency", k.node_status_report_frequency),
                ("syncFrequency", k.sync_frequency),
            ] {
                if d.0.is_zero() {
                    problems.bad(&format!("{p}.{name}"), "must be > 0");
                }
            }
            for (name, v) in [
                (
                    "imageGCHighThresholdPercent",
                    k.image_gc_high_threshold_percent,
                ),
                (
                    "imageGCLowThresholdPercent",
                    k.image_gc_low_threshold_percent,
                ),
            ] {
                if !(0..=100).contains(&v) {
                    problems.bad(
                        &format!("{p}.{name}"),
                        format!("must be between 0 and 100, got {v}"),
                    );
                }
            }
            if k.image_gc_low_threshold_percent >= k.image_gc_high_threshold_percent {
                problems.bad(
                    &format!("{p}.imageGCLowThresholdPercent"),
                    format!(
                        "must be less than imageGCHighThresholdPercent ({})",
                        k.image_gc_high_threshold_percent
                    ),
                );
            }
            if !k.image_maximum_gc_age.is_zero()
                && k.image_maximum_gc_age.0 <= k.image_minimum_gc_age.0
            {
                problems.bad(
                    &format!("{p}.imageMaximumGCAge"),
                    format!(
                        "must be greater than imageMinimumGCAge ({})",
                        format_go_duration(k.image_minimum_gc_age.0)
                    ),
                );
            }
            if k.address.parse::<std::net::IpAddr>().is_err() {
                problems.bad(
                    &format!("{p}.address"),
                    format!("not an IP address: {:?}", k.address),
                );
            }
            for (i, dns) in k.cluster_dns.iter().enumerate() {
                if dns.parse::<std::net::IpAddr>().is_err() {
                    problems.bad(
                        &format!("{p}.clusterDNS[{i}]"),
                        format!("not an IP address: {dns:?}"),
                    );
                }
            }
        }

        let mm = &self.modules.meta_manager;
        if mm.enable {
            problems.positive(
                "modules.metaManager.remoteQueryTimeout",
                mm.remote_query_timeout,
            );
        }
        let eb = &self.modules.event_bus;
        if eb.enable {
            if !(0..=2).contains(&eb.mqtt_mode) {
                problems.bad(
                    "modules.eventBus.mqttMode",
                    format!("must be 0, 1 or 2, got {}", eb.mqtt_mode),
                );
            }
            if !(0..=2).contains(&eb.mqtt_qos) {
                problems.bad(
                    "modules.eventBus.mqttQOS",
                    format!("must be 0, 1 or 2, got {}", eb.mqtt_qos),
                );
            }
        }
        if let Some(ext) = &self.kubeedge_rs {
            problems.non_negative("kubeedgeRs.deadLinkTimeout", ext.dead_link_timeout);
        }
        problems.into_result()
    }
}
