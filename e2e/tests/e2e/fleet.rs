//! Fleet scale: the downstream fetcher answers many resyncs with few apiserver reads (one GET
//! of a configmap for every node waiting for it, one paginated list of all pods for many
//! nodes' pods, one list per node for a few), counted by cloudcore's own request metrics.
//! Runs against the in-memory apiserver or a real cluster (`E2E_KUBECONFIG`: its other pods
//! only make the list of all pods longer).

use cloudcore::apiserver_requests::{ApiRequestMetrics, CountRequests, RequestLabels};
use cloudcore::controller::{
    ConfigKind, ConfigWant, DownstreamInput as Input, Fetch, spawn_fetcher,
};
use e2e::cluster;
use e2e::sim_edge::{WAIT, delete_node, edge_node, unique};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const NODES: usize = 40;

fn requests(m: &ApiRequestMetrics, verb: &'static str, resource: &'static str) -> u64 {
    m.requests
        .get_or_create(&RequestLabels {
            verb,
            resource,
            code: "2xx",
        })
        .get()
}

/// Collects answers until `done` says every node has what it asked for.
async fn collect<F>(answers: &mut mpsc::Receiver<Input>, mut done: F)
where
    F: FnMut(Input) -> bool,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let input = tokio::time::timeout_at(deadline, answers.recv())
            .await
            .expect("fetcher answers in time")
            .expect("fetcher running");
        if done(input) {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_resyncs_cost_few_apiserver_reads() {
    let cluster = cluster::connect().await.expect("cluster");
    let ns = cluster.temp_namespace("fleet").await.unwrap();
    let nodes: Vec<String> = (0..NODES).map(|i| unique(&format!("fleet-{i}"))).collect();
    for n in &nodes {
        edge_node(&cluster, n).await;
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    for (i, n) in nodes.iter().enumerate() {
        for j in 0..2 {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("p{i}-{j}")},
                "spec": {"nodeName": n, "containers": [{"name": "c", "image": "busybox"}]}
            }))
            .unwrap();
            pods.create(&PostParams::default(), &p).await.unwrap();
        }
    }
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), &ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "shared"}, "data": {"v": "1"}}))
            .unwrap();
    let cm = cms.create(&PostParams::default(), &cm).await.unwrap();
    let cm_rv: u64 = cm.metadata.resource_version.unwrap().parse().unwrap();

    let metrics = ApiRequestMetrics::default();
    let client = kube::client::ClientBuilder::try_from(cluster.kube_config())
        .unwrap()
        .with_layer(&CountRequests(metrics.clone()))
        .build();
    let (fetch_tx, fetch_rx) = mpsc::unbounded_channel();
    let (answers_tx, mut answers) = mpsc::channel(4096);
    let stop = CancellationToken::new();
    let fetcher = spawn_fetcher(client, fetch_rx, answers_tx, stop.clone());

    // Every node needs the configmap: one GET serves them all (the later ones from the cache).
    for n in &nodes {
        let want = ConfigWant {
            kind: ConfigKind::ConfigMap,
            key: (ns.clone(), "shared".into()),
            rv: cm_rv,
        };
        fetch_tx
            .send(Fetch::Configs {
                node: n.clone(),
                keys: vec![want],
            })
            .unwrap();
    }
    let mut served = BTreeSet::new();
    collect(&mut answers, |input| {
        if let Input::ConfigsFetched { node, objects } = input {
            assert_eq!(objects.len(), 1);
            assert_eq!(objects[0].object.as_ref().unwrap()["data"]["v"], "1");
            served.insert(node);
        }
        served.len() == NODES
    })
    .await;
    assert_eq!(
        requests(&metrics, "get", "configmaps"),
        1,
        "GETs of the configmap"
    );

    // Every node needs both its pods: more nodes than a round lists one by one, so one
    // paginated list of all pods answers them.
    let lists_before = requests(&metrics, "list", "pods");
    for (i, n) in nodes.iter().enumerate() {
        let keys = (0..2).map(|j| (ns.clone(), format!("p{i}-{j}"))).collect();
        fetch_tx
            .send(Fetch::Pods {
                node: n.clone(),
                keys,
            })
            .unwrap();
    }
    let mut got: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    collect(&mut answers, |input| {
        if let Input::PodsFetched { node, keys, pods } = input {
            *answered.entry(node.clone()).or_default() += keys.len();
            for p in pods {
                assert_eq!(p.spec.unwrap().node_name.as_deref(), Some(node.as_str()));
                got.entry(node.clone())
                    .or_default()
                    .insert(p.metadata.name.unwrap());
            }
        }
        answered.values().sum::<usize>() == NODES * 2
    })
    .await;
    for (i, n) in nodes.iter().enumerate() {
        let want: BTreeSet<String> = (0..2).map(|j| format!("p{i}-{j}")).collect();
        assert_eq!(got.get(n), Some(&want), "pods of {n}");
    }
    let lists = requests(&metrics, "list", "pods") - lists_before;
    let all_pods = Api::<Pod>::all(cluster.client())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len();
    let pages = all_pods.div_ceil(500) as u64;
    assert!(
        lists >= 1 && lists <= pages + 1 && lists < NODES as u64,
        "{lists} pod lists for {NODES} nodes ({all_pods} pods in the cluster)"
    );

    // A new edge node: all its pods, from a list of its own.
    let lists_before = requests(&metrics, "list", "pods");
    fetch_tx
        .send(Fetch::PodsOf {
            node: nodes[0].clone(),
            generation: 7,
        })
        .unwrap();
    let mut listed = BTreeSet::new();
    collect(&mut answers, |input| match input {
        Input::PodsListed {
            node,
            generation,
            pods,
            complete,
        } => {
            assert_eq!((node.as_str(), generation), (nodes[0].as_str(), 7));
            listed.extend(pods.into_iter().filter_map(|p| p.metadata.name));
            complete
        }
        _ => false,
    })
    .await;
    assert_eq!(listed, BTreeSet::from(["p0-0".into(), "p0-1".into()]));
    assert_eq!(requests(&metrics, "list", "pods") - lists_before, 1);

    stop.cancel();
    let _ = fetcher.await;
    for n in &nodes {
        delete_node(&cluster, n).await;
    }
}
