//! Kubernetes Events from edged, end to end: a real edgecore on the private containerd records
//! them, they travel edge → cloudcore (`event` insert/patch) → API server, and are read back
//! through kube-rs and `kubectl get events`.

use e2e::channel::Pki;
use e2e::cloud::CloudFixture;
use e2e::edge::{EdgeEnv, WAIT, wait_for};
use e2e::images::BUSYBOX_IMAGE;
use e2e::sim_edge::{SimEdge, delete_node, edge_node, unique};
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use kubeedge_shared::operation::source;
use kubeedge_shared::{Group, Message, Operation};
use serde_json::{Value, json};

/// The events about one pod (by UID), as JSON.
async fn events_of(env: &EdgeEnv, uid: &str) -> Vec<Value> {
    let events: Api<Event> = Api::namespaced(env.cluster.client(), &env.ns);
    let lp = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
    match events.list(&lp).await {
        Ok(list) => list
            .items
            .iter()
            .map(|e| serde_json::to_value(e).expect("an event serialises"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Waits until the pod has an event satisfying `check`; returns it.
async fn wait_event(env: &EdgeEnv, uid: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    wait_for(what, WAIT, || async {
        events_of(env, uid).await.into_iter().find(|e| check(e))
    })
    .await
}

/// An event with this reason whose message contains `needle`.
fn is(reason: &str, needle: &str) -> impl Fn(&Value) -> bool + use<> {
    let (reason, needle) = (reason.to_string(), needle.to_string());
    move |e: &Value| {
        e["reason"] == reason.as_str()
            && e["message"]
                .as_str()
                .is_some_and(|m| m.contains(needle.as_str()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_has_pulled_created_and_started_events_and_deletion_a_killing_one() {
    let env = EdgeEnv::start("events-run").await;
    let pod = env
        .create_pod(json!({
            "metadata": {"name": "web"},
            "spec": {"terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}]},
        }))
        .await;
    let uid = pod.metadata.uid.clone().unwrap();
    env.wait_running("web").await;

    let started = wait_event(&env, &uid, "a Started event", is("Started", "main")).await;
    assert_eq!(
        started["involvedObject"],
        json!({"kind": "Pod", "namespace": env.ns, "name": "web", "uid": uid,
               "apiVersion": "v1", "resourceVersion": started["involvedObject"]["resourceVersion"],
               "fieldPath": "spec.containers{main}"}),
        "{started:#}"
    );
    assert!(started["involvedObject"]["resourceVersion"].is_string());
    assert_eq!(started["message"], "Started container main");
    assert_eq!(started["type"], "Normal");
    assert_eq!(
        started["source"],
        json!({"component": "kubelet", "host": env.node})
    );
    assert_eq!(started["count"], 1);
    assert!(started["firstTimestamp"].is_string(), "{started:#}");
    assert!(
        started["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("web."),
        "{started:#}"
    );
    // `:latest` is pulled (policy Always) before the container is created.
    let events = events_of(&env, &uid).await;
    for (reason, needle) in [
        ("Pulling", "Pulling image \"localhost:5000/busybox:latest\""),
        ("Pulled", "Successfully pulled image"),
        ("Created", "Created container: main"),
    ] {
        assert!(
            events.iter().any(is(reason, needle)),
            "no {reason} event in {events:#?}"
        );
    }
    assert!(events.iter().all(|e| e["type"] == "Normal"), "{events:#?}");

    // kubectl sees them too.
    let out = env
        .cluster
        .kubectl_run(
            &[
                "get",
                "events",
                "-n",
                &env.ns,
                "--field-selector",
                &format!("involvedObject.uid={uid}"),
                "-o",
                "jsonpath={range .items[*]}{.reason}{\"\\n\"}{end}",
            ],
            None,
        )
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    for reason in ["Pulling", "Pulled", "Created", "Started"] {
        assert!(
            out.stdout.lines().any(|l| l == reason),
            "kubectl: {}",
            out.stdout
        );
    }

    // Deleting the pod stops its container: a Killing event.
    env.pods()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let killing = wait_event(
        &env,
        &uid,
        "a Killing event",
        is("Killing", "Stopping container main"),
    )
    .await;
    assert_eq!(
        killing["involvedObject"]["fieldPath"],
        "spec.containers{main}"
    );

    // The node has the kubelet's node events, in namespace default, about the Node.
    let node_events: Api<Event> = Api::namespaced(env.cluster.client(), "default");
    let lp = ListParams::default().fields(&format!("involvedObject.uid={}", env.node));
    let reasons = wait_for("the node's events", WAIT, || async {
        let list = node_events.list(&lp).await.ok()?;
        let reasons: Vec<String> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
        let all = ["Starting", "NodeReady", "NodeHasSufficientMemory"]
            .iter()
            .all(|r| reasons.iter().any(|x| x == r));
        all.then_some(list.items)
    })
    .await;
    let ready = reasons
        .iter()
        .find(|e| e.reason.as_deref() == Some("NodeReady"))
        .map(|e| serde_json::to_value(e).unwrap())
        .unwrap();
    assert_eq!(
        ready["involvedObject"],
        json!({"kind": "Node", "name": env.node, "uid": env.node})
    );
    assert_eq!(
        ready["message"],
        format!("Node {} status is now: NodeReady", env.node)
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_warning_events_and_repeats_grow_one_events_count() {
    let env = EdgeEnv::start("events-fail").await;
    let missing = "localhost:5000/no-such-image:1";
    let bad = env
        .create_pod(json!({
            "metadata": {"name": "bad-image"},
            "spec": {"containers": [{"name": "app", "image": missing}]},
        }))
        .await;
    let crasher = env
        .create_pod(json!({
            "metadata": {"name": "crasher"},
            "spec": {"containers": [
                {"name": "boom", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                 "command": ["sh", "-c", "exit 1"]},
                {"name": "idle", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                 "command": ["sleep", "3600"],
                 "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1}},
            ]},
        }))
        .await;
    let bad_uid = bad.metadata.uid.clone().unwrap();
    let crasher_uid = crasher.metadata.uid.clone().unwrap();

    // The missing image: the pull fails, then backs off.
    let failed = wait_event(
        &env,
        &bad_uid,
        "a Failed pull event",
        is("Failed", &format!("Failed to pull image \"{missing}\"")),
    )
    .await;
    assert_eq!(failed["type"], "Warning");
    assert_eq!(
        failed["involvedObject"]["fieldPath"],
        "spec.containers{app}"
    );
    wait_event(
        &env,
        &bad_uid,
        "Error: ErrImagePull",
        is("Failed", "Error: ErrImagePull"),
    )
    .await;
    let back_off = wait_event(
        &env,
        &bad_uid,
        "a BackOff pulling event",
        is("BackOff", "Back-off pulling image"),
    )
    .await;
    assert_eq!(back_off["type"], "Normal");
    wait_event(
        &env,
        &bad_uid,
        "Error: ImagePullBackOff",
        is("Failed", "Error: ImagePullBackOff"),
    )
    .await;

    // The present image is not pulled again.
    wait_event(
        &env,
        &crasher_uid,
        "an already-present Pulled event",
        is("Pulled", "already present on machine"),
    )
    .await;
    // A failing readiness probe is Unhealthy.
    let unhealthy = wait_event(
        &env,
        &crasher_uid,
        "an Unhealthy event",
        is("Unhealthy", "Readiness probe failed"),
    )
    .await;
    assert_eq!(unhealthy["type"], "Warning");
    assert_eq!(
        unhealthy["involvedObject"]["fieldPath"],
        "spec.containers{idle}"
    );
    // The crash loop: one BackOff event whose count grows (patched, not re-created).
    let back_off = wait_event(
        &env,
        &crasher_uid,
        "a BackOff event counted at least twice",
        |e| {
            is("BackOff", "Back-off restarting failed container boom")(e)
                && e["count"].as_i64().unwrap_or(0) >= 2
        },
    )
    .await;
    assert_eq!(back_off["type"], "Warning");
    assert_eq!(
        back_off["involvedObject"]["fieldPath"],
        "spec.containers{boom}"
    );
    assert_ne!(back_off["firstTimestamp"], back_off["lastTimestamp"]);
    let events = events_of(&env, &crasher_uid).await;
    let back_offs = events
        .iter()
        .filter(|e| {
            e["reason"] == "BackOff" && e["involvedObject"]["fieldPath"] == "spec.containers{boom}"
        })
        .count();
    assert_eq!(back_offs, 1, "{events:#?}");
    let started = events
        .iter()
        .find(|e| is("Started", "Started container boom")(e))
        .unwrap_or_else(|| panic!("no Started event for boom in {events:#?}"));
    assert!(started["count"].as_i64().unwrap() >= 1);
    env.finish().await;
}

/// What cloudcore does with each `event` operation a KubeEdge edge sends (protocol §11): insert
/// creates (again: fine), update replaces, patch `{event, patchData}` patches, or creates the
/// event when it is gone.
#[tokio::test]
async fn cloudcore_records_event_inserts_updates_and_patches_from_an_edge() {
    let cluster = e2e::cluster::connect().await.expect("cluster");
    let ns = cluster.temp_namespace("ev").await.expect("namespace");
    let pki = Pki::new().unwrap();
    let fx = CloudFixture::start(cluster.client(), &pki)
        .await
        .expect("cloudcore");
    let node = unique("edge-ev");
    edge_node(&cluster, &node).await;
    let mut edge = SimEdge::connect(&fx, &pki, &node, &[]).await;
    let events: Api<Event> = Api::namespaced(cluster.client(), &ns);
    let event = |name: &str, count: i64, message: &str| {
        json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": "p", "uid": "u-1", "apiVersion": "v1"},
            "reason": "BackOff", "message": message, "type": "Warning", "count": count,
            "source": {"component": "kubelet", "host": node},
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"})
    };
    let mut send = async |op: Operation, name: &str, content: Value| {
        let msg = Message::new(
            source::EDGED,
            Group::Meta,
            op,
            format!("{ns}/event/{name}"),
            content,
        );
        edge.request(&msg).await.content
    };
    let get = async |name: &str| {
        let e = events.get(name).await.expect("the event exists");
        serde_json::to_value(e).unwrap()
    };

    assert_eq!(
        send(Operation::Insert, "a.1", event("a.1", 1, "m")).await,
        "OK"
    );
    assert_eq!(get("a.1").await["count"], 1);
    // Inserted again (e.g. re-sent after a reconnect): still recorded once.
    assert_eq!(
        send(Operation::Insert, "a.1", event("a.1", 1, "m")).await,
        "OK"
    );
    // A patch carries the event and a strategic merge patch.
    let patch = json!({"count": 5, "lastTimestamp": "2026-01-01T00:01:00Z"}).to_string();
    let reply = send(
        Operation::Patch,
        "a.1",
        json!({"event": event("a.1", 5, "m"), "patchData": patch}),
    )
    .await;
    assert_eq!(reply, "OK");
    let a = get("a.1").await;
    assert_eq!(a["count"], 5);
    assert_eq!(a["lastTimestamp"], "2026-01-01T00:01:00Z");
    assert_eq!(a["firstTimestamp"], "2026-01-01T00:00:00Z");
    // A patch of an event the API no longer has creates it from `event`.
    let reply = send(
        Operation::Patch,
        "b.2",
        json!({"event": event("b.2", 3, "gone"), "patchData": patch}),
    )
    .await;
    assert_eq!(reply, "OK");
    assert_eq!(get("b.2").await["message"], "gone");
    // An update replaces the event.
    let reply = send(Operation::Update, "a.1", event("a.1", 7, "replaced")).await;
    assert_eq!(reply, "OK");
    let a = get("a.1").await;
    assert_eq!(
        (a["count"].clone(), a["message"].clone()),
        (json!(7), json!("replaced"))
    );
    // Garbage is refused with a reason.
    let reply = send(
        Operation::Patch,
        "c.3",
        json!({"event": {}, "patchData": "{not json"}),
    )
    .await;
    let err = kubeedge_shared::content::StatusError::from_content(&reply)
        .unwrap_or_else(|| panic!("a StatusError: {reply}"));
    assert_eq!(err.code(), 400, "{reply}");

    delete_node(&cluster, &node).await;
    fx.stop();
}
