//! Image garbage collection end to end: a real edgecore on a containerd of its own (the
//! collection removes every unused image of the runtime, which would take images other tests
//! of the shared containerd are about to use; the harness turns it off, these tests on).
//!
//! * With periodic collection off (`imageGCHighThresholdPercent: 100`) and an eviction
//!   threshold the disk always crosses (`nodefs.available: 100%`), DiskPressure removes an
//!   unused image at once;
//! * with `imageGCHighThresholdPercent: 1` / `imageGCLowThresholdPercent: 0` the periodic
//!   collection runs, removes an unused image, cannot get below 0 % and says so
//!   (`FreeDiskSpaceFailed`, then `ImageGCFailed`).
//!
//! Either way the image of the running pod and the pinned sandbox image stay, and the pod
//! keeps running.

use e2e::containerd::Containerd;
use e2e::edge::{EdgeEnv, WAIT, container_id, wait_for};
use e2e::images::{BUSYBOX_IMAGE, LayerBuilder, OciImage, PAUSE_IMAGE, repository_and_tag};
use edgecore::app::EdgeCore;
use edgecore::config::TailoredKubeletConfig;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use kubeedge_edged::cri::{CriClient, api};
use serde_json::json;
use std::time::Duration;

/// An image no pod uses, distinct from every other (its own layer).
fn unused_image(name: &str) -> OciImage {
    let mut layer = LayerBuilder::new();
    layer
        .file("gc-victim", 0o644, name.as_bytes())
        .expect("layer entry");
    OciImage::from_layers(vec![layer.finish().expect("layer")], &["/gc-victim"], &[])
}

/// The image's ID if the runtime has it.
async fn image_id(cri: &CriClient, reference: &str) -> Option<String> {
    cri.image()
        .image_status(api::ImageStatusRequest {
            image: Some(api::ImageSpec {
                image: reference.into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .expect("ImageStatus")
        .into_inner()
        .image
        .map(|i| i.id)
}

/// Pushes a new unused image to the containerd's registry and pulls it through CRI.
async fn pull_unused(containerd: &Containerd, cri: &CriClient, reference: &str) {
    let image = unused_image(reference);
    let (repository, tag) = repository_and_tag(reference);
    tokio::task::block_in_place(|| containerd.registry().push(&image, repository, tag))
        .unwrap_or_else(|e| panic!("pushing {reference}: {e}"));
    cri.image()
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: reference.into(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_or_else(|e| panic!("pulling {reference}: {e}"));
    assert_eq!(
        image_id(cri, reference).await.as_deref(),
        Some(image.id()),
        "{reference} pulled"
    );
}

/// Restarts edgecore with changed kubelet settings and a short collection period.
async fn restart_with(env: &mut EdgeEnv, tune: impl FnOnce(&mut TailoredKubeletConfig)) {
    env.stop_edge().await;
    tune(&mut env.config.modules.edged.tailored_kubelet_config);
    env.config.validate().expect("tuned edgecore.yaml is valid");
    let mut edged = env.edged_config();
    // The harness turns image GC off; here it follows the file.
    edged.image_gc_high_threshold_percent = env
        .config
        .modules
        .edged
        .tailored_kubelet_config
        .image_gc_high_threshold_percent;
    edged.image_gc_period = Duration::from_millis(500);
    let edge = EdgeCore::start_with(&env.config, Some(edged))
        .await
        .expect("edgecore starts");
    env.edge = Some(edge);
}

/// Events with this reason about the node (its UID in events is its name).
async fn node_events(env: &EdgeEnv, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::all(env.cluster.client());
    let lp = ListParams::default().fields(&format!("involvedObject.uid={}", env.node));
    events
        .list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_images_are_collected_on_disk_pressure_and_over_the_high_threshold() {
    let (containerd, mut env) = EdgeEnv::start_on_own_containerd("image-gc").await;
    let cri = env.cri().await;
    // A static pod uses busybox: a critical pod, never evicted under the disk pressure this
    // test forces (an ordinary pod would be, after the images, as by the kubelet).
    let manifests = env.dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    std::fs::write(
        manifests.join("user.yaml"),
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "user", "namespace": env.ns},
            "spec": {"terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"]}]}})
        .to_string(),
    )
    .expect("write the manifest");
    let user = env.wait_running(&format!("user-{}", env.node)).await;
    let busybox = image_id(&cri, BUSYBOX_IMAGE).await.expect("busybox");
    let pause = image_id(&cri, PAUSE_IMAGE).await.expect("pause");
    let first = "localhost:5000/gc-victim-pressure:1";
    pull_unused(&containerd, &cri, first).await;

    // Periodic collection off; the disk is always "under pressure".
    restart_with(&mut env, |k| {
        k.image_gc_high_threshold_percent = 100;
        k.eviction_hard
            .insert("nodefs.available".into(), "100%".into());
    })
    .await;
    wait_for(
        "the unused image removed under DiskPressure",
        WAIT,
        || async { image_id(&cri, first).await.is_none().then_some(()) },
    )
    .await;
    assert_eq!(image_id(&cri, BUSYBOX_IMAGE).await, Some(busybox.clone()));
    assert_eq!(image_id(&cri, PAUSE_IMAGE).await, Some(pause.clone()));

    // An image pulled now is younger than imageMinimumGCAge (2m) for this edgecore; the
    // next one, started after the pull, saw it from its start (long ago for it).
    let second = "localhost:5000/gc-victim-threshold:1";
    pull_unused(&containerd, &cri, second).await;
    env.stop_edge().await;
    assert!(
        image_id(&cri, second).await.is_some(),
        "an image younger than imageMinimumGCAge stays under DiskPressure"
    );
    restart_with(&mut env, |k| {
        k.image_gc_high_threshold_percent = 1;
        k.image_gc_low_threshold_percent = 0;
        k.eviction_hard.remove("nodefs.available");
    })
    .await;
    wait_for(
        "the unused image removed over the high threshold",
        WAIT,
        || async { image_id(&cri, second).await.is_none().then_some(()) },
    )
    .await;
    // 0 % is out of reach: each collection fails, repeated failures are ImageGCFailed.
    let failed = wait_for("an ImageGCFailed event on the node", WAIT, || async {
        node_events(&env, "ImageGCFailed").await.pop()
    })
    .await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains("Failed to garbage collect required amount of images"),
        "{message}"
    );
    assert!(!node_events(&env, "FreeDiskSpaceFailed").await.is_empty());
    assert_eq!(image_id(&cri, BUSYBOX_IMAGE).await, Some(busybox));
    assert_eq!(image_id(&cri, PAUSE_IMAGE).await, Some(pause));
    let still = env.wait_running(&format!("user-{}", env.node)).await;
    assert_eq!(container_id(&still, 0), container_id(&user, 0));
    env.finish().await;
    drop(containerd);
}
