//! The cloudcore image built without Docker (`e2e::cloudcore_image`, the `build-image` CLI) runs
//! as a pod on a real edge's containerd and serves a second edge from inside the container.
//!
//! Edge A (EdgeEnv: in-process cloudcore, real edgecore and containerd) runs the image as a
//! hostNetwork pod against the in-memory API server, its cloudcore.yaml from a ConfigMap and its
//! kubeconfig and CA from a Secret. Edge B, an in-process edgecore with a certificate from that
//! CA, dials the pod's cloudhub port: its Node becomes Ready and a pod bound to it runs.

use e2e::cloudcore_image::{self, CloudcoreImageSpec};
use e2e::edge::{
    EdgeEnv, EdgeOptions, WAIT, is_running_and_ready, node_name, shared_containerd,
    test_edged_config, wait_for, write_edge_config,
};
use e2e::images::{BUSYBOX_IMAGE, normalized_reference};
use edgecore::app::EdgeCore;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kubeedge_edged::cri::api;
use serde_json::json;
use std::time::Duration;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `GET /readyz` on cloudcore's monitor address answers 200.
async fn ready(monitor: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(monitor).await else {
        return false;
    };
    if s.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").await.is_err() {
        return false;
    }
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    buf.starts_with(b"HTTP/1.0 200") || buf.starts_with(b"HTTP/1.1 200")
}

#[tokio::test]
async fn cloudcore_image_runs_as_a_pod_and_serves_an_edge() {
    if e2e::cluster::real_cluster_configured() {
        println!(
            "SKIPPED cloudcore_image_runs_as_a_pod_and_serves_an_edge: it hands the test's \
             kubeconfig to a cloudcore in a pod; the in-memory API server's is self-contained \
             (loopback, embedded CA and token), a real cluster's may name files on this machine \
             and carries credentials not meant for a throwaway pod"
        );
        return;
    }
    let env = EdgeEnv::start("ccimg").await;

    // The image, from the cloudcore binary of this build (or E2E_CLOUDCORE_BINARY, e.g. the
    // release one), imported into the edge's containerd.
    let binary = tokio::task::spawn_blocking(|| match std::env::var_os("E2E_CLOUDCORE_BINARY") {
        Some(path) => std::path::PathBuf::from(path),
        None => {
            e2e::devices::workspace_binary("cloudcore", "cloudcore").expect("the cloudcore binary")
        }
    })
    .await
    .unwrap();
    let tag = format!(
        "localhost:5000/kubeedge-rs/cloudcore:e2e-{}",
        std::process::id()
    );
    let archive = env.dir.path().join("cloudcore-image.tar");
    let (built, archive) = tokio::task::spawn_blocking({
        let tag = tag.clone();
        move || {
            let built = cloudcore_image::build(&CloudcoreImageSpec::new(&binary, "e2e"))
                .unwrap_or_else(|e| panic!("{e}"));
            built
                .image
                .write_archive_file(&archive, &[&normalized_reference(&tag)])
                .unwrap_or_else(|e| panic!("{e}"));
            shared_containerd()
                .ctr(&["images".as_ref(), "import".as_ref(), archive.as_os_str()])
                .unwrap_or_else(|e| panic!("{e}"));
            (built, archive)
        }
    })
    .await
    .unwrap();
    let _ = std::fs::remove_file(&archive);
    let cri = env.cri().await;
    wait_for("CRI lists the imported cloudcore image", WAIT, || async {
        let status = cri
            .image()
            .image_status(api::ImageStatusRequest {
                image: Some(api::ImageSpec {
                    image: tag.clone(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .ok()?;
        status.into_inner().image
    })
    .await;

    // Its configuration: a CA of its own (edge B's certificate comes from it), the in-memory
    // API server's kubeconfig, every port free and on loopback.
    let pki = e2e::channel::Pki::new().expect("a PKI");
    let hub_port = free_port();
    let monitor = format!("127.0.0.1:{}", free_port());
    let kubeconfig = std::fs::read_to_string(env.cluster.kubeconfig()).expect("the kubeconfig");
    let config = format!(
        "apiVersion: cloudcore.config.kubeedge.io/v1alpha2\nkind: CloudCore\n\
         commonConfig:\n  monitorServer:\n    bindAddress: \"{monitor}\"\n\
         kubeAPIConfig:\n  kubeConfig: /etc/kubeedge/secret/kubeconfig\n\
         modules:\n  cloudHub:\n    advertiseAddress: [\"127.0.0.1\"]\n\
         \x20   tlsCAFile: /etc/kubeedge/secret/rootCA.crt\n    tlsCAKeyFile: /etc/kubeedge/secret/rootCA.key\n\
         \x20   tlsCertFile: /etc/kubeedge/none/server.crt\n    tlsPrivateKeyFile: /etc/kubeedge/none/server.key\n\
         \x20   websocket:\n      enable: true\n      address: 127.0.0.1\n      port: {hub_port}\n\
         \x20   https:\n      enable: false\n\
         \x20   unixsocket:\n      enable: false\n\
         \x20 iptablesManager:\n    enable: false\n"
    );
    let ns = env.ns.clone();
    let client = env.cluster.client();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "cloudcore", "namespace": ns},
        "data": {"cloudcore.yaml": config}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .expect("ConfigMap cloudcore");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "cloudcore", "namespace": ns},
        "stringData": {
            "kubeconfig": kubeconfig,
            "rootCA.crt": pki.ca.cert.cert_pem,
            "rootCA.key": pki.ca.cert.key_pem,
        }
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret cloudcore");

    // The image's entrypoint and user; only the config path is given, as the Helm chart does.
    env.create_pod(json!({
        "metadata": {"name": "cloudcore"},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "cloudcore", "image": tag, "imagePullPolicy": "IfNotPresent",
                "args": ["--config", "/etc/kubeedge/config/cloudcore.yaml"],
                "env": [{"name": "RUST_LOG", "value": "info"}],
                "securityContext": {"runAsNonRoot": true},
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/kubeedge/config"},
                    {"name": "secret", "mountPath": "/etc/kubeedge/secret"}
                ]
            }],
            "volumes": [
                {"name": "config", "configMap": {"name": "cloudcore"}},
                {"name": "secret", "secret": {"secretName": "cloudcore"}}
            ]
        }
    }))
    .await;
    let running = env.wait_running("cloudcore").await;
    let id = e2e::edge::container_id(&running, 0);
    let answer = cri
        .runtime()
        .container_status(api::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: true,
        })
        .await
        .expect("ContainerStatus")
        .into_inner();
    let status = answer.status.expect("a container status");
    // The process runs as the image's user (no runAsUser in the pod).
    let info: serde_json::Value = answer
        .info
        .get("info")
        .and_then(|i| serde_json::from_str(i).ok())
        .expect("containerd's verbose info");
    let pid = info["pid"].as_u64().expect("the container's pid");
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let uids = proc_status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("a Uid line");
    assert!(
        uids.split_whitespace().all(|u| u == "65532"),
        "cloudcore runs as uids {uids:?}, not the image's 65532"
    );
    assert!(
        status
            .image_ref
            .contains(built.image.manifest.digest.trim_start_matches("sha256:"))
            || status
                .image_ref
                .contains(built.image.id().trim_start_matches("sha256:")),
        "the container runs {:?}, not the built image {}",
        status.image_ref,
        built.image.manifest.digest
    );
    let log_path = status.log_path.clone();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // cloudcore in the container lists from the API server and serves its monitor port.
    let deadline = tokio::time::Instant::now() + WAIT;
    while !ready(&monitor).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "cloudcore in the pod not ready on {monitor} within {WAIT:?}; its log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Edge B dials the containerized cloudhub.
    let node_b = node_name("ccimg-b");
    let dir_b = tempfile::tempdir().expect("temp dir");
    let config_b = write_edge_config(
        dir_b.path(),
        &pki,
        &node_b,
        &format!("127.0.0.1:{hub_port}"),
        &shared_containerd().endpoint(),
        &EdgeOptions::new("ccimg-b"),
    );
    let edge_b = EdgeCore::start_with(&config_b, Some(test_edged_config(&config_b, dir_b.path())))
        .await
        .expect("edge B starts");
    let hub_b = edge_b.hub();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !hub_b.is_connected() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "edge B did not connect to the pod's cloudhub 127.0.0.1:{hub_port} within {WAIT:?}; \
             cloudcore's log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for(&format!("node {node_b} Ready"), WAIT, || async {
        let node = env.nodes().get_opt(&node_b).await.ok()??;
        let node = serde_json::to_value(&node).ok()?;
        node["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
            .then_some(())
    })
    .await;

    // A pod bound to edge B reaches it through the containerized cloudcore and runs; its
    // status comes back the same way.
    let pods: Api<Pod> = env.pods();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "on-b"},
        "spec": {
            "nodeName": node_b, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod on-b");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let p = pods.get_opt("on-b").await.ok().flatten();
        let v = serde_json::to_value(&p).unwrap_or_default();
        if is_running_and_ready(&v) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod on-b not Running on edge B within {WAIT:?}; status {:#}\ncloudcore's log:\n{}",
            v["status"],
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Clean up: the pods (edge B stops its own through the containerized cloudcore), edge B,
    // its Node, then edge A and the rest.
    let _ = pods.delete("on-b", &DeleteParams::default()).await;
    wait_for("pod on-b removed", WAIT, || async {
        matches!(pods.get_opt("on-b").await, Ok(None)).then_some(())
    })
    .await;
    edge_b.shutdown().await;
    let sandboxes = cri
        .runtime()
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: [("kubeedge-rs.io/node".to_string(), node_b.clone())].into(),
                ..Default::default()
            }),
        })
        .await
        .map(|r| r.into_inner().items)
        .unwrap_or_default();
    for s in sandboxes {
        let _ = cri
            .runtime()
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: s.id.clone(),
            })
            .await;
        let _ = cri
            .runtime()
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: s.id,
            })
            .await;
    }
    let _ = env.nodes().delete(&node_b, &DeleteParams::default()).await;
    let _ = pods.delete("cloudcore", &DeleteParams::default()).await;
    wait_for("pod cloudcore removed", WAIT, || async {
        matches!(pods.get_opt("cloudcore").await, Ok(None)).then_some(())
    })
    .await;
    let _ = cri
        .image()
        .remove_image(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: tag.clone(),
                ..Default::default()
            }),
        })
        .await;
    env.finish().await;
}

/// `build-image cloudcore` writes the archive and pushes to a registry over HTTP; containerd
/// pulls what was pushed (CRI PullImage) and gets the same image ID the tool printed.
#[tokio::test]
async fn build_image_cli_writes_the_archive_and_pushes_to_a_registry() {
    let containerd = tokio::task::spawn_blocking(shared_containerd)
        .await
        .unwrap();
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("image.tar");
    let tool = tokio::task::spawn_blocking(|| {
        e2e::devices::workspace_binary("e2e", "build-image").expect("build-image")
    })
    .await
    .unwrap();
    // Any glibc program stands in for cloudcore: the CLI, the archive and the push are tested.
    let tag = format!("cli-{}", std::process::id());
    let push = format!(
        "{}/kubeedge-rs/cloudcore:{tag}",
        containerd.registry().host()
    );
    let output = tokio::process::Command::new(&tool)
        .args([
            "cloudcore",
            "--binary",
            "/bin/true",
            "--version",
            "7.7.7",
            "--out",
        ])
        .arg(&out)
        .args(["--push", &push])
        .output()
        .await
        .expect("running build-image");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "build-image failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name).map(str::trim))
            .unwrap_or_else(|| panic!("no {name} line in:\n{stdout}"))
            .to_string()
    };
    assert_eq!(
        field("image "),
        concat!(
            "docker.io/kubeedge-rs/cloudcore:",
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(field("pushed "), push);
    assert!(out.metadata().expect("the archive").len() > 0);
    // Same inputs, same image: a second run prints the same manifest digest.
    let again = tokio::process::Command::new(&tool)
        .args([
            "cloudcore",
            "--binary",
            "/bin/true",
            "--version",
            "7.7.7",
            "--out",
        ])
        .arg(dir.path().join("again.tar"))
        .output()
        .await
        .expect("running build-image");
    assert!(
        String::from_utf8_lossy(&again.stdout).contains(&field("manifest ")),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(dir.path().join("again.tar")).unwrap(),
        "two runs wrote different archives"
    );

    // localhost:5000 is the harness' registry for its containerd.
    let reference = format!("localhost:5000/kubeedge-rs/cloudcore:{tag}");
    let cri = containerd.cri().await.expect("CRI");
    let pulled = cri
        .image()
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: reference.clone(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_or_else(|e| panic!("PullImage {reference}: {e}"))
        .into_inner();
    assert_eq!(pulled.image_ref, field("id "));
    let _ = cri
        .image()
        .remove_image(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: reference,
                ..Default::default()
            }),
        })
        .await;
}
