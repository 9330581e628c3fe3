//! Pod cgroups and QoS classes on real containerd (cgroup v1 here; the v2 paths are unit-tested
//! on a recorded hierarchy): each pod's cgroup sits under `kubepods` by QoS class with the
//! pod's limits, its containers run inside it, and it goes when the pod goes. Each test edge
//! has a `cgroupRoot` of its own (`e2e::edge::cgroup_root`).

use e2e::edge::{EdgeEnv, WAIT, cgroup_root, container_id, exec, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use serde_json::{Value, json};
use std::path::PathBuf;

fn v1_mounted() -> bool {
    std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").is_file()
}

fn pod(name: &str, resources: Value) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"], "resources": resources}]},
    })
}

fn read(controller: &str, rel: &str, file: &str) -> String {
    let p = PathBuf::from("/sys/fs/cgroup")
        .join(controller)
        .join(rel.trim_start_matches('/'))
        .join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_run_in_cgroups_of_their_qos_class_with_their_limits() {
    if !v1_mounted() {
        println!(
            "SKIPPED: no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory (v2 is unit-tested)"
        );
        return;
    }
    let env = EdgeEnv::start("cgroups").await;
    let root = cgroup_root(&env.node);
    let pods = format!("{root}/kubepods");
    // kubepods: limited to what pods may use (no reservations in the test config).
    let limit: u64 = read("memory", &pods, "memory.limit_in_bytes")
        .parse()
        .unwrap();
    assert!(
        limit > 0 && limit < u64::MAX / 2,
        "kubepods memory limit {limit}"
    );
    assert_eq!(
        read("cpu", &format!("{pods}/besteffort"), "cpu.shares"),
        "2"
    );

    let cases = [
        (
            "guaranteed",
            json!({"limits": {"cpu": "200m", "memory": "64Mi"}}),
            "",
        ),
        (
            "burstable",
            json!({"requests": {"cpu": "100m"}, "limits": {"memory": "128Mi"}}),
            "/burstable",
        ),
        ("besteffort", json!({}), "/besteffort"),
    ];
    let mut created = Vec::new();
    for (name, resources, _) in &cases {
        created.push(env.create_pod(pod(name, resources.clone())).await);
    }
    for (i, (name, _, qos_dir)) in cases.iter().enumerate() {
        let running = env.wait_running(name).await;
        let uid = created[i].metadata.uid.clone().expect("a uid");
        let pod_cg = format!("{pods}{qos_dir}/pod{uid}");
        // The container's own cgroup is inside the pod's.
        let (rc, out) = exec(
            &env.cri().await,
            &container_id(&running, 0),
            &["cat", "/proc/self/cgroup"],
        )
        .await;
        assert_eq!(rc, 0, "{out}");
        let mem_line = out
            .lines()
            .find(|l| l.split(':').nth(1) == Some("memory"))
            .unwrap_or_else(|| panic!("no memory line in {out}"));
        assert!(
            mem_line.contains(&format!("{pod_cg}/")),
            "{name}: {mem_line} not under {pod_cg}"
        );
        match *name {
            "guaranteed" => {
                assert_eq!(read("memory", &pod_cg, "memory.limit_in_bytes"), "67108864");
                assert_eq!(read("cpu", &pod_cg, "cpu.cfs_quota_us"), "20000");
                assert_eq!(read("cpu", &pod_cg, "cpu.shares"), "204");
            }
            "burstable" => {
                assert_eq!(
                    read("memory", &pod_cg, "memory.limit_in_bytes"),
                    "134217728"
                );
                assert_eq!(read("cpu", &pod_cg, "cpu.cfs_quota_us"), "-1");
                assert_eq!(read("cpu", &pod_cg, "cpu.shares"), "102");
            }
            _ => {
                assert_eq!(read("cpu", &pod_cg, "cpu.shares"), "2");
                let unlimited: u64 = read("memory", &pod_cg, "memory.limit_in_bytes")
                    .parse()
                    .unwrap();
                assert!(unlimited > limit / 2, "no pod memory limit: {unlimited}");
            }
        }
        assert_eq!(
            running["status"]["qosClass"]
                .as_str()
                .map(str::to_lowercase),
            Some(name.to_string())
        );
    }

    // A deleted pod's cgroup goes with it.
    let uid = created[1].metadata.uid.clone().expect("a uid");
    let dir = PathBuf::from("/sys/fs/cgroup/memory")
        .join(pods.trim_start_matches('/'))
        .join(format!("burstable/pod{uid}"));
    assert!(dir.is_dir());
    env.pods()
        .delete("burstable", &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    wait_for("the deleted pod's cgroup to go", WAIT, || async {
        (!dir.exists()).then_some(())
    })
    .await;
    env.finish().await;
}
