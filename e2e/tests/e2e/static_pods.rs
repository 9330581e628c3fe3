//! Static pods on real containerd: a manifest in `staticPodPath` runs as a pod of the node with
//! a mirror pod in the cluster that carries its status; a deleted mirror comes back; a changed
//! manifest replaces the pod; while the cloud is away manifests added and removed take
//! effect, and after an offline restart the static pod keeps running; back online the mirrors
//! follow.

use e2e::edge::{EdgeEnv, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use serde_json::Value;
use std::path::Path;

fn manifest(ns: &str, name: &str, word: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    app: static\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"echo {word}; exec sleep 3600\"]\n"
    )
}

/// The running containers of the static pod `name` (by the kubelet's pod-name label).
async fn running_containers(env: &EdgeEnv, name: &str) -> Vec<String> {
    use kubeedge_edged::cri::api;
    let cri = env.cri().await;
    let list = cri
        .runtime()
        .list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: std::collections::HashMap::from([
                    ("io.kubernetes.pod.name".to_string(), name.to_string()),
                    ("kubeedge-rs.io/node".to_string(), env.node.clone()),
                ]),
                ..Default::default()
            }),
        })
        .await
        .expect("ListContainers")
        .into_inner();
    list.containers
        .into_iter()
        .filter(|c| c.state() == api::ContainerState::ContainerRunning)
        .map(|c| c.id)
        .collect()
}

async fn mirror(env: &EdgeEnv, name: &str) -> Option<Value> {
    let p = env.pods().get_opt(name).await.ok()??;
    serde_json::to_value(p).ok()
}

fn mirror_hash(p: &Value) -> Option<String> {
    p["metadata"]["annotations"]["kubernetes.io/config.mirror"]
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn static_pods_run_from_manifests_online_and_offline_with_mirror_pods() {
    let mut env = EdgeEnv::start("static").await;
    let dir = env.dir.path().join("manifests");
    std::fs::create_dir_all(&dir).expect("manifest dir");
    let web = format!("web-{}", env.node);
    let db = format!("db-{}", env.node);
    let ns = env.ns.clone();
    std::fs::write(dir.join("web.yaml"), manifest(&ns, "web", "one")).expect("write manifest");

    // It runs, and its mirror pod shows it Running.
    let m = wait_for("the mirror pod of web, Running", WAIT, || async {
        let m = mirror(&env, &web).await?;
        (m["status"]["phase"] == "Running" && mirror_hash(&m).is_some()).then_some(m)
    })
    .await;
    assert_eq!(
        m["metadata"]["annotations"]["kubernetes.io/config.source"],
        "file"
    );
    assert_eq!(m["spec"]["nodeName"], env.node.as_str());
    let first = running_containers(&env, &web).await;
    assert_eq!(first.len(), 1);

    // A deleted mirror comes back; the static pod is untouched.
    let uid = m["metadata"]["uid"].as_str().unwrap().to_string();
    env.pods()
        .delete(&web, &kube::api::DeleteParams::default())
        .await
        .expect("delete the mirror");
    wait_for("the mirror pod back with a new uid", WAIT, || async {
        let m = mirror(&env, &web).await?;
        (m["metadata"]["uid"].as_str() != Some(&uid)
            && m["metadata"]["deletionTimestamp"].is_null())
        .then_some(())
    })
    .await;
    assert_eq!(running_containers(&env, &web).await, first);

    // A changed manifest is a new pod.
    let old_hash = mirror_hash(&m);
    std::fs::write(dir.join("web.yaml"), manifest(&ns, "web", "two")).expect("rewrite manifest");
    wait_for(
        "the mirror of the changed manifest, Running",
        WAIT,
        || async {
            let m = mirror(&env, &web).await?;
            (mirror_hash(&m) != old_hash && m["status"]["phase"] == "Running").then_some(())
        },
    )
    .await;
    wait_for("the new container replacing the old", WAIT, || async {
        let now = running_containers(&env, &web).await;
        (now.len() == 1 && now != first).then_some(())
    })
    .await;

    // Offline: a new manifest runs, a removed one stops.
    env.link.freeze();
    env.wait_edge_link(false).await;
    std::fs::write(dir.join("db.yaml"), manifest(&ns, "db", "db")).expect("write manifest");
    std::fs::remove_file(dir.join("web.yaml")).expect("remove manifest");
    wait_for("db running and web stopped, offline", WAIT, || async {
        let db_running = running_containers(&env, &db).await.len() == 1;
        let web_gone = running_containers(&env, &web).await.is_empty();
        (db_running && web_gone).then_some(())
    })
    .await;
    // An offline restart: the static pod is adopted, not collected as an orphan.
    let db_container = running_containers(&env, &db).await;
    env.stop_edge().await;
    env.start_edge().await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        running_containers(&env, &db).await,
        db_container,
        "the static pod keeps its container across an offline restart"
    );

    // Online again: db gets its mirror, web's goes.
    env.link.thaw();
    env.wait_edge_link(true).await;
    wait_for(
        "db's mirror Running and web's mirror gone",
        WAIT,
        || async {
            let db_ok = mirror(&env, &db)
                .await
                .is_some_and(|m| m["status"]["phase"] == "Running");
            let web_gone = mirror(&env, &web).await.is_none();
            (db_ok && web_gone).then_some(())
        },
    )
    .await;
    std::fs::remove_file(dir.join("db.yaml")).expect("remove manifest");
    wait_for("db's mirror gone with its manifest", WAIT, || async {
        mirror(&env, &db).await.is_none().then_some(())
    })
    .await;
    assert!(Path::new(&dir).is_dir());
    env.finish().await;
}
