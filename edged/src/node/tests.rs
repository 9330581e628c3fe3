use super::*;

fn config() -> EdgedConfig {
    let mut c = EdgedConfig {
        node_name: "edge-7".into(),
        node_ip: "10.0.0.7".into(),
        hostname: "box".into(),
        ..EdgedConfig::default()
    };
    c.node_labels.insert("region".into(), "hz".into());
    c
}

#[test]
fn a_lease_with_a_malformed_spec_is_an_error_not_a_panic() {
    let c = config();
    for bad in [
        json!({"spec": "x"}),
        json!({"spec": [1]}),
        json!({"spec": 3}),
        json!("lease"),
    ] {
        let mut lease = bad.clone();
        let e = renew_spec(&mut lease, &c).unwrap_err();
        assert!(e.contains("not a JSON object"), "{bad}: {e}");
    }
    let mut lease = json!({"metadata": {"name": "edge-7"}, "spec": null});
    renew_spec(&mut lease, &c).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "edge-7");
    assert!(lease["spec"]["renewTime"].is_string());
}

#[test]
fn the_node_object_is_an_edge_node_with_machine_resources() {
    let c = config();
    let machine = Machine {
        cpus: 4,
        memory_bytes: 8 << 30,
        ephemeral_bytes: 100 << 30,
    };
    let report = NodeReport {
        allocatable: allocatable(&machine, &c),
        machine,
        runtime_version: "containerd://1.6.20".into(),
        health: Health {
            not_ready: None,
            network_message: None,
            memory_pressure: false,
            disk_pressure: false,
            pid_pressure: false,
        },
    };
    let mut status = node_status(&c, &report);
    stamp_conditions(&mut status, &[], "2024-01-01T00:00:00Z");
    let node = node_object(&c, status);
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels[LABEL_EDGE_ROLE], "");
    assert_eq!(labels[LABEL_AGENT_ROLE], "");
    assert_eq!(labels["kubernetes.io/hostname"], "edge-7");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["region"], "hz");
    let s = &node["status"];
    assert_eq!(s["capacity"]["cpu"], "4");
    assert_eq!(s["capacity"]["memory"], "8388608Ki");
    assert_eq!(s["capacity"]["pods"], "110");
    // 100Mi of memory and 10 % of the disk are held back for eviction.
    assert_eq!(
        s["allocatable"]["memory"],
        format!("{}Ki", (8u64 << 20) - 100 * 1024)
    );
    assert_eq!(
        s["allocatable"]["ephemeral-storage"],
        format!("{}Ki", 90u64 << 20)
    );
    assert_eq!(
        s["addresses"][0],
        json!({"type": "InternalIP", "address": "10.0.0.7"})
    );
    assert_eq!(
        s["addresses"][1],
        json!({"type": "Hostname", "address": "box"})
    );
    assert_eq!(s["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10350);
    assert_eq!(
        s["nodeInfo"]["containerRuntimeVersion"],
        "containerd://1.6.20"
    );
    let ready = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");
    assert_eq!(ready["reason"], "KubeletReady");
    assert_eq!(ready["lastTransitionTime"], "2024-01-01T00:00:00Z");
    // Transition times survive while the status holds.
    let mut again = node_status(&c, &report);
    stamp_conditions(
        &mut again,
        s["conditions"].as_array().unwrap(),
        "2024-01-01T00:01:00Z",
    );
    let ready = again["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["lastTransitionTime"], "2024-01-01T00:00:00Z");
    assert_eq!(ready["lastHeartbeatTime"], "2024-01-01T00:01:00Z");
}

#[test]
fn a_runtime_that_is_down_makes_the_node_not_ready() {
    let h = health_of(&Err("connection refused".into()), Default::default());
    assert!(h.not_ready.unwrap().contains("container runtime is down"));
    let h = health_of(
        &Ok(vec![("NetworkReady".into(), false, "x: y".into())]),
        crate::eviction::Conditions {
            disk: true,
            ..Default::default()
        },
    );
    assert!(h.disk_pressure && !h.memory_pressure && !h.pid_pressure);
    assert_eq!(h.not_ready, None);
    assert!(h.network_message.is_some());
}

#[test]
fn a_cloud_side_condition_change_is_noticed() {
    let sent = vec![
        json!({"type": "Ready", "status": "True"}),
        json!({"type": "MemoryPressure", "status": "False"}),
    ];
    let same = json!({"status": {"conditions": [
        {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "x"},
        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
    ]}});
    assert!(!conditions_differ(&same, &sent));
    let unknown = json!({"status": {"conditions": [
        {"type": "MemoryPressure", "status": "Unknown"},
        {"type": "Ready", "status": "Unknown"},
    ]}});
    assert!(conditions_differ(&unknown, &sent));
    assert!(conditions_differ(&json!({}), &sent));
}

#[test]
fn condition_changes_become_the_kubelets_node_events() {
    let status = |ready: &str, memory: &str| {
        json!({"conditions": [
            {"type": "Ready", "status": ready},
            {"type": "MemoryPressure", "status": memory},
            {"type": "DiskPressure", "status": "False"},
            {"type": "PIDPressure", "status": "False"},
            {"type": "NetworkUnavailable", "status": "False"},
        ]})
    };
    let mut known = HashMap::new();
    assert_eq!(
        condition_events(&mut known, &status("True", "False")),
        [
            "NodeReady",
            "NodeHasSufficientMemory",
            "NodeHasNoDiskPressure",
            "NodeHasSufficientPID"
        ],
        "each once at start"
    );
    assert!(condition_events(&mut known, &status("True", "False")).is_empty());
    assert_eq!(
        condition_events(&mut known, &status("False", "True")),
        ["NodeNotReady", "NodeHasInsufficientMemory"]
    );
    assert_eq!(
        condition_events(&mut known, &status("True", "True")),
        ["NodeReady"]
    );
    assert!(condition_events(&mut known, &json!({})).is_empty());
}

#[test]
fn thresholds_read_quantities_and_percentages() {
    assert_eq!(threshold(Some(&"10%".to_string()), 1000), Some(100));
    assert_eq!(threshold(Some(&"100Mi".to_string()), 0), Some(100 << 20));
    assert_eq!(threshold(None, 10), None);
    assert_eq!(cpu_quantity(1500), "1500m");
    assert_eq!(cpu_quantity(2000), "2");
}
