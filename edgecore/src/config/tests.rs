//! Tests of the edgecore.yaml loader.

use super::*;
use std::time::Duration;

fn parse(text: &str) -> Result<EdgeCoreConfig, ConfigError> {
    EdgeCoreConfig::from_yaml(text, "edgecore.yaml")
}

#[test]
fn default_config_round_trips_through_yaml_and_is_valid() {
    let c = EdgeCoreConfig::default_config();
    c.validate().unwrap();
    let yaml = c.to_yaml().unwrap();
    assert!(
        yaml.contains("apiVersion: edgecore.config.kubeedge.io/v1alpha2"),
        "{yaml}"
    );
    assert!(yaml.contains("messageQPS: 30"), "{yaml}");
    assert!(yaml.contains("nodeStatusReportFrequency: 5m0s"), "{yaml}");
    let back = parse(&yaml).unwrap();
    assert_eq!(back, c);
}

#[test]
fn kubeedge_defaults() {
    let c = EdgeCoreConfig::default_config();
    let hub = &c.modules.edge_hub;
    assert_eq!(
        (hub.heartbeat, hub.message_qps, hub.message_burst),
        (15, 30, 60)
    );
    assert_eq!(hub.project_id, "e632aba927ea4ac2b575ec1603d56f10");
    assert!(hub.websocket.server.ends_with(":10000"));
    assert!(hub.http_server.starts_with("https://") && hub.http_server.ends_with(":10002"));
    assert_eq!(c.database.data_source, "/var/lib/kubeedge/edgecore.db");
    let e = &c.modules.edged;
    assert_eq!(e.hostname_override, hostname());
    assert_eq!(
        e.hostname_override,
        e.hostname_override.to_ascii_lowercase()
    );
    assert_eq!(e.tailored_kubelet_config.read_only_port, 10350);
    assert_eq!(e.tailored_kubelet_config.node_lease_duration_seconds, 40);
    assert_eq!(c.modules.meta_manager.remote_query_timeout, 60);
    assert_eq!(c.modules.meta_manager.context_send_module, "websocket");
}

#[test]
fn absent_and_null_keys_keep_defaults_and_unknown_keys_are_ignored() {
    let c = parse(
            "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\nmodules:\n  edgeHub:\n    heartbeat: 20\n    someFutureKey: {a: 1}\n    websocket:\n      server: 10.0.0.1:10000\n  metaManager:\n    metaServer:\n      apiAudiences: null\n  taskManager:\n    enable: true\n",
        )
        .unwrap();
    assert_eq!(c.modules.edge_hub.heartbeat, 20);
    assert_eq!(c.modules.edge_hub.message_qps, 30);
    let k = parse(
            "modules:\n  edged:\n    tailoredKubeletConfig:\n      imageGCHighThresholdPercent: 90\n      imageGCLowThresholdPercent: 70\n      imageMinimumGCAge: 5m\n      imageMaximumGCAge: 168h\n      cgroupsPerQOS: false\n      registryPullQPS: 1\n      clusterDNS: [10.96.0.10]\n",
        )
        .unwrap()
        .modules
        .edged
        .tailored_kubelet_config;
    assert_eq!(
        (
            k.image_gc_high_threshold_percent,
            k.image_gc_low_threshold_percent
        ),
        (90, 70)
    );
    assert_eq!(k.image_minimum_gc_age, KubeDuration::secs(300));
    assert_eq!(k.image_maximum_gc_age, KubeDuration::secs(168 * 3600));
    assert!(!k.cgroups_per_qos);
    assert_eq!(k.registry_pull_qps, 1);
    assert_eq!(k.cluster_dns, ["10.96.0.10"]);
    assert_eq!(c.modules.edge_hub.websocket.server, "10.0.0.1:10000");
    assert_eq!(c.modules.edge_hub.websocket.handshake_timeout, 30);
    assert!(c.modules.edge_hub.enable);
    assert!(c.modules.meta_manager.meta_server.api_audiences.is_empty());
}

#[test]
fn wrong_types_name_the_field() {
    let err = parse("modules:\n  edgeHub:\n    heartbeat: often\n").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("modules.edgeHub.heartbeat"), "{text}");
    let err = parse("modules:\n  edged:\n    tailoredKubeletConfig:\n      syncFrequency: soon\n")
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("modules.edged.tailoredKubeletConfig.syncFrequency"),
        "{text}"
    );
    assert!(text.contains("invalid duration"), "{text}");
    let err = parse("modules:\n  edgeHub:\n    enable: maybe\n").unwrap_err();
    assert!(err.to_string().contains("modules.edgeHub.enable"), "{err}");
    assert!(matches!(
        parse("modules: [\n"),
        Err(ConfigError::Syntax { .. })
    ));
    assert!(matches!(
        parse("- a\n- b\n"),
        Err(ConfigError::Syntax { .. })
    ));
}

#[test]
fn invalid_values_are_all_reported_with_their_paths() {
    let mut c = EdgeCoreConfig::default_config();
    c.modules.edge_hub.heartbeat = 0;
    c.modules.edge_hub.message_qps = -1;
    c.modules.edge_hub.websocket.server = "nocolon".into();
    c.modules.edge_hub.quic.enable = true;
    c.modules.edged.hostname_override = "Edge_1".into();
    c.modules.edged.tailored_kubelet_config.cluster_dns = vec!["dns".into()];
    c.modules.edged.tailored_kubelet_config.image_maximum_gc_age = KubeDuration::secs(60);
    c.modules.meta_manager.remote_query_timeout = 0;
    c.kind = "CloudCore".into();
    let errors = c.validate().unwrap_err();
    let paths: Vec<&str> = errors.0.iter().map(|e| e.path.as_str()).collect();
    for p in [
        "kind",
        "modules.edgeHub.heartbeat",
        "modules.edgeHub.messageQPS",
        "modules.edgeHub.websocket.server",
        "modules.edgeHub.quic.enable",
        "modules.edged.hostnameOverride",
        "modules.edged.tailoredKubeletConfig.clusterDNS[0]",
        "modules.edged.tailoredKubeletConfig.imageMaximumGCAge",
        "modules.metaManager.remoteQueryTimeout",
    ] {
        assert!(paths.contains(&p), "{p} missing in {errors}");
    }
    assert!(
        errors
            .to_string()
            .contains("modules.edgeHub.heartbeat: must be > 0"),
        "{errors}"
    );
}

#[test]
fn an_unknown_cgroup_driver_is_refused_by_name() {
    let e = parse("modules:\n  edged:\n    tailoredKubeletConfig:\n      cgroupDriver: lxc\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("modules.edged.tailoredKubeletConfig.cgroupDriver") && e.contains("systemd"),
        "{e}"
    );
    let c = parse("modules:\n  edged:\n    tailoredKubeletConfig:\n      cgroupDriver: systemd\n")
        .unwrap();
    assert_eq!(
        c.modules.edged.tailored_kubelet_config.cgroup_driver,
        CgroupDriver::Systemd
    );
}

#[test]
fn kubeedge_v1_15_sample_loads() {
    let text = include_str!("../../tests/data/edgecore-v1.15.yaml");
    let c = parse(text).unwrap();
    c.validate().unwrap();
    assert_eq!(c.node_name(), "edge-node-1");
    assert_eq!(c.modules.edge_hub.websocket.server, "192.168.1.10:10000");
    assert_eq!(c.modules.edge_hub.http_server, "https://192.168.1.10:10002");
    let k = &c.modules.edged.tailored_kubelet_config;
    assert_eq!(k.cluster_dns, vec!["169.254.96.16".to_string()]);
    assert_eq!(k.node_status_update_frequency.0, Duration::from_secs(10));
    assert_eq!(k.sync_frequency.0, Duration::from_secs(60));
    assert_eq!(k.eviction_hard["memory.available"], "100Mi");
    assert_eq!(c.modules.edged.node_labels["region"], "hz");
    let hub = crate::edgehub::EdgeHubConfig::from_edgecore(&c);
    assert_eq!(hub.node_name, "edge-node-1");
    assert_eq!(hub.heartbeat, Duration::from_secs(15));
    assert_eq!(
        hub.capabilities,
        ["inventory-resync", "ping-keepalive", "cloud-lease=40"]
    );
}

/// Every key the default config writes must be spelled as KubeEdge spells it: each
/// path must exist in the KubeEdge-written sample — but for `modules.edgeMesh`, kubeedge-rs's
/// Services at the edge (KubeEdge v1.6 had a module of that name; v1.7+ ignore the key).
#[test]
fn every_written_key_is_a_kubeedge_key() {
    fn paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
        if let Value::Object(m) = v {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                // evictionHard keys are data, not schema.
                if !p.ends_with("evictionHard") && !p.ends_with("nodeLabels") {
                    paths(x, &p, out);
                }
                out.push(p);
            }
        }
    }
    let sample: Value =
        serde_saphyr::from_str(include_str!("../../tests/data/edgecore-v1.15.yaml")).unwrap();
    let mut ours = Vec::new();
    paths(
        &serde_json::to_value(EdgeCoreConfig::default()).unwrap(),
        "",
        &mut ours,
    );
    let mut theirs = Vec::new();
    paths(&sample, "", &mut theirs);
    let unknown: Vec<_> = ours
        .iter()
        .filter(|p| !theirs.contains(p) && !p.starts_with("modules.edgeMesh"))
        .collect();
    assert!(
        unknown.is_empty(),
        "keys KubeEdge does not write: {unknown:?}"
    );
}

#[test]
fn standing_watches_parse_and_bad_ones_name_their_key() {
    use crate::metaserver::{MetaServerConfig, StandingWatch};
    assert_eq!(
        StandingWatch::parse("v1/endpoints").unwrap().key_prefix(),
        "/core/v1/endpoints"
    );
    assert_eq!(
        StandingWatch::parse("discovery.k8s.io/v1/endpointslices")
            .unwrap()
            .key_prefix(),
        "/discovery.k8s.io/v1/endpointslices"
    );
    assert!(StandingWatch::parse("endpoints").is_err());
    assert!(StandingWatch::parse("v1/End points").is_err());
    let mut c = EdgeCoreConfig::default_config();
    c.modules.meta_manager.meta_server.enable = true;
    c.modules.meta_manager.meta_server.standing_watches = vec!["v1/endpoints".into(), "x".into()];
    let e = MetaServerConfig::from_edgecore(&c).unwrap_err();
    assert!(e.contains("standingWatches[1]"), "{e}");
    c.modules.meta_manager.meta_server.standing_watches =
        vec!["v1/endpoints".into(), "v1/namespaces".into()];
    let ms = MetaServerConfig::from_edgecore(&c).unwrap().unwrap();
    assert_eq!(ms.standing.len(), 2);
}

#[test]
fn minimal_yaml_is_a_subset_that_loads_back_to_the_minimal_config() {
    let c = EdgeCoreConfig::minimal_config();
    let yaml = c.to_minimal_yaml().unwrap();
    assert!(yaml.contains("websocket:"), "{yaml}");
    assert!(!yaml.contains("serviceBus"), "{yaml}");
    assert!(!yaml.contains("messageQPS"), "{yaml}");
    assert_eq!(parse(&yaml).unwrap(), c);
}

#[test]
fn edgehub_and_metamanager_settings_follow_the_file() {
    let mut c = EdgeCoreConfig::default_config();
    c.modules.edge_hub.heartbeat = 7;
    c.modules.edge_hub.websocket.server = "cloud:443".into();
    c.modules.edge_hub.websocket.write_deadline = 3;
    c.modules.edged.hostname_override = "n1".into();
    c.modules.meta_manager.remote_query_timeout = 9;
    c.kubeedge_rs = Some(KubeEdgeRsSettings {
        inventory_resync: false,
        dead_link_timeout: 50,
        ping_keepalive: false,
        cloud_lease: false,
    });
    let h = crate::edgehub::EdgeHubConfig::from_edgecore(&c);
    assert_eq!(h.server, "cloud:443");
    assert_eq!(h.heartbeat, Duration::from_secs(7));
    assert_eq!(h.write_timeout, Duration::from_secs(3));
    assert_eq!(h.dead_link_timeout, Duration::from_secs(50));
    assert!(h.capabilities.is_empty());
    let m = crate::metamanager::MetaManagerConfig::from_edgecore(&c);
    assert_eq!(m.node_name, "n1");
    assert_eq!(m.remote_query_timeout, Duration::from_secs(9));
    assert!(!m.inventory_resync);
}
