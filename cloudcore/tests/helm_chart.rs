//! The Helm chart in `charts/cloudcore` and the plain manifests in `manifests/`, checked without Helm (none exists on these
//! machines): a renderer for the template subset the chart uses (`{{ .Values.x }}`,
//! `.Release.*`, `.Chart.AppVersion`, `toYaml .Values.x | nindent N`, `if`/`end`), then every
//! rendered document is parsed and checked against what cloudcore needs.

use cloudcore::config::CloudCoreConfig;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const RELEASE_NAME: &str = "cloudcore";
const NAMESPACE: &str = "kubeedge";

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/cloudcore")
}

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(text: &str, what: &str) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}\n---\n{text}"))
}

/// The chart's values.yaml.
fn default_values() -> Value {
    yaml(&read(&chart_dir().join("values.yaml")), "values.yaml")
}

/// `--set a.b.c=v` (objects only).
fn set(values: &mut Value, path: &str, v: Value) {
    let mut cur = values;
    let mut keys = path.split('.').peekable();
    while let Some(k) = keys.next() {
        if keys.peek().is_none() {
            cur[k] = v;
            return;
        }
        cur = &mut cur[k];
    }
}

fn lookup<'a>(root: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(root, |v, k| {
        v.get(k).unwrap_or_else(|| panic!("no value {path}"))
    })
}

/// Go template truthiness: false, 0, "", null and empty collections are false.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

struct Scope {
    values: Value,
    app_version: String,
}

impl Scope {
    fn value(&self, expr: &str) -> Value {
        match expr {
            ".Release.Name" => json!(RELEASE_NAME),
            ".Release.Namespace" => json!(NAMESPACE),
            ".Chart.AppVersion" => json!(self.app_version),
            _ => {
                let path = expr
                    .strip_prefix(".Values.")
                    .unwrap_or_else(|| panic!("unsupported template expression {expr:?}"));
                lookup(&self.values, path).clone()
            }
        }
    }

    /// One `{{ … }}` action outside the `if`/`end` structure.
    fn action(&self, action: &str) -> String {
        if let Some(rest) = action.strip_prefix(".Files.Get ") {
            // A chart file, verbatim (Helm does not render it).
            let (path, indent) = rest
                .split_once("| nindent ")
                .unwrap_or_else(|| panic!(".Files.Get without nindent: {action:?}"));
            let n: usize = indent.trim().parse().expect("nindent width");
            let text = read(&chart_dir().join(path.trim().trim_matches('"')));
            let pad = " ".repeat(n);
            return text.lines().map(|l| format!("\n{pad}{l}")).collect();
        }
        if let Some(rest) = action.strip_prefix("toYaml ") {
            let (expr, indent) = rest
                .split_once("| nindent ")
                .unwrap_or_else(|| panic!("toYaml without nindent: {action:?}"));
            let n: usize = indent.trim().parse().expect("nindent width");
            let text = serde_saphyr::to_string(&self.value(expr.trim())).expect("toYaml");
            let pad = " ".repeat(n);
            return text
                .trim_end()
                .lines()
                .map(|l| format!("\n{pad}{l}"))
                .collect();
        }
        match self.value(action) {
            Value::String(s) => s,
            v @ (Value::Bool(_) | Value::Number(_)) => v.to_string(),
            v => panic!("{action:?} renders {v} (use toYaml)"),
        }
    }
}

/// An `if` condition: `<expr>`, `eq <expr> "<literal>"`, `and`/`or` of operands that are
/// `<expr>`s or parenthesized conditions.
fn condition(cond: &str, scope: &Scope) -> bool {
    let cond = cond.trim();
    if let Some(inner) = cond.strip_prefix('(').and_then(|c| c.strip_suffix(')')) {
        return condition(inner, scope);
    }
    if let Some(rest) = cond.strip_prefix("eq ") {
        let (expr, lit) = rest.trim().split_once(' ').expect("eq takes two operands");
        return scope.value(expr) == json!(lit.trim().trim_matches('"'));
    }
    let (is_and, rest) = match (cond.strip_prefix("and "), cond.strip_prefix("or ")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return truthy(&scope.value(cond)),
    };
    // Operands: bare words, or groups up to the matching parenthesis.
    let mut operands = Vec::new();
    let (mut depth, mut start) = (0usize, None);
    for (i, c) in rest.char_indices() {
        match c {
            '(' => {
                if depth == 0 {
                    start = Some(i);
                }
                depth += 1;
            }
            ')' => {
                depth -= 1;
                if depth == 0 {
                    operands.push(&rest[start.take().expect("open")..=i]);
                }
            }
            c if c.is_whitespace() && depth == 0 => {
                if let Some(s) = start.take() {
                    operands.push(&rest[s..i]);
                }
            }
            _ if start.is_none() => start = Some(i),
            _ => {}
        }
    }
    assert_eq!(depth, 0, "unbalanced parentheses in {cond:?}");
    if let Some(s) = start {
        operands.push(&rest[s..]);
    }
    assert!(operands.len() >= 2, "{cond:?} needs two operands");
    let mut values = operands.iter().map(|o| condition(o, scope));
    if is_and {
        values.all(|b| b)
    } else {
        values.any(|b| b)
    }
}

/// Renders one template: `{{-`/`-}}` trim whitespace as in Go templates; `if` nests.
fn render(template: &str, scope: &Scope) -> String {
    let mut out = String::new();
    let mut emitting: Vec<bool> = Vec::new();
    let mut rest = template;
    let mut trim_next = false;
    while let Some(start) = rest.find("{{") {
        let mut text = &rest[..start];
        if trim_next {
            text = text.trim_start();
        }
        let after = &rest[start + 2..];
        let end = after.find("}}").expect("unclosed {{");
        let mut action = &after[..end];
        if let Some(a) = action.strip_prefix('-') {
            text = text.trim_end();
            action = a;
        }
        trim_next = action.ends_with('-');
        let action = action.trim_end_matches('-').trim();
        let on = emitting.iter().all(|b| *b);
        if on {
            out.push_str(text);
        }
        if let Some(cond) = action.strip_prefix("if ") {
            emitting.push(condition(cond, scope));
        } else if action == "else" {
            let b = emitting.pop().expect("else without if");
            emitting.push(!b);
        } else if action == "end" {
            emitting.pop().expect("end without if");
        } else if on {
            out.push_str(&scope.action(action));
        }
        rest = &after[end + 2..];
    }
    assert!(emitting.is_empty(), "unterminated if");
    out.push_str(if trim_next { rest.trim_start() } else { rest });
    out
}

/// Every document of every template (and the CRDs), rendered with these values.
fn render_chart(values: Value) -> Vec<Value> {
    let chart = yaml(&read(&chart_dir().join("Chart.yaml")), "Chart.yaml");
    let scope = Scope {
        values,
        app_version: chart["appVersion"].as_str().expect("appVersion").into(),
    };
    let mut files: Vec<PathBuf> = ["templates", "crds"]
        .iter()
        .flat_map(|d| std::fs::read_dir(chart_dir().join(d)).expect("chart dir"))
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for f in files {
        let rendered = render(&read(&f), &scope);
        docs.extend(documents(&rendered, &f.display().to_string()));
    }
    for d in &docs {
        for field in ["apiVersion", "kind"] {
            assert!(d[field].is_string(), "{field} missing in {d}");
        }
        assert!(d["metadata"]["name"].is_string(), "metadata.name in {d}");
    }
    docs
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn installed_values() -> Value {
    let mut v = default_values();
    set(
        &mut v,
        "cloudCore.modules.cloudHub.advertiseAddress",
        json!(["203.0.113.10"]),
    );
    v
}

fn ports(list: &Value, key: &str) -> Vec<u64> {
    let mut p: Vec<u64> = list
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| p[key].as_u64().expect("port number"))
        .collect();
    p.sort();
    p
}

#[test]
fn config_map_holds_a_cloudcore_yaml_that_cloudcore_loads() {
    // Without advertiseAddress (the chart's default) cloudcore refuses to start, naming it.
    let docs = render_chart(default_values());
    let cm = find(&docs, "ConfigMap", "cloudcore").expect("ConfigMap cloudcore");
    let text = cm["data"]["cloudcore.yaml"]
        .as_str()
        .expect("cloudcore.yaml");
    let err = CloudCoreConfig::from_yaml(text).expect_err("advertiseAddress is required");
    assert!(err.to_string().contains("advertiseAddress"), "{err}");

    let docs = render_chart(installed_values());
    let cm = find(&docs, "ConfigMap", "cloudcore").expect("ConfigMap cloudcore");
    assert_eq!(cm["metadata"]["namespace"], NAMESPACE);
    let text = cm["data"]["cloudcore.yaml"]
        .as_str()
        .expect("cloudcore.yaml");
    let cfg = CloudCoreConfig::from_yaml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let hub = &cfg.modules.cloud_hub;
    assert_eq!(hub.advertise_address, ["203.0.113.10"]);
    assert!(hub.websocket.enable && hub.https.enable && cfg.modules.cloud_stream.enable);
    assert!(
        cfg.kube_api_config.kube_config.is_empty(),
        "in-cluster config"
    );
    let monitor: std::net::SocketAddr = cfg
        .common_config
        .monitor_server
        .bind_address
        .parse()
        .expect("monitor address");
    assert!(
        monitor.ip().is_unspecified(),
        "probes reach the pod address"
    );

    // The ports cloudcore listens on are the ones the Deployment and Service declare.
    let mut listening = vec![
        u64::from(hub.websocket.port),
        u64::from(hub.https.port),
        u64::from(cfg.modules.cloud_stream.stream_port),
        u64::from(cfg.modules.cloud_stream.tunnel_port),
    ];
    listening.sort();
    assert_eq!(listening, [10000, 10002, 10003, 10004]);
    let svc = find(&docs, "Service", "cloudcore").expect("Service cloudcore");
    assert_eq!(ports(&svc["spec"]["ports"], "port"), listening);
    assert_eq!(ports(&svc["spec"]["ports"], "targetPort"), listening);
    let deploy = find(&docs, "Deployment", "cloudcore").expect("Deployment cloudcore");
    let container = &deploy["spec"]["template"]["spec"]["containers"][0];
    let mut with_monitor = listening.clone();
    with_monitor.push(u64::from(monitor.port()));
    with_monitor.sort();
    assert_eq!(ports(&container["ports"], "containerPort"), with_monitor);
    let mount = &container["volumeMounts"][0]["mountPath"];
    assert_eq!(
        format!("{}/cloudcore.yaml", mount.as_str().expect("mountPath")),
        cloudcore::config::DEFAULT_CONFIG_PATH
    );
}

#[test]
fn deployment_sets_namespace_probes_and_keeps_off_edge_nodes() {
    let docs = render_chart(installed_values());
    let deploy = find(&docs, "Deployment", "cloudcore").expect("Deployment cloudcore");
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "cloudcore");
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(
        deploy["spec"]["selector"]["matchLabels"],
        deploy["spec"]["template"]["metadata"]["labels"]
    );
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "kubeedge-rs/cloudcore:0.1.0");
    let env = c["env"].as_array().expect("env");
    let ns = env
        .iter()
        .find(|e| e["name"] == "POD_NAMESPACE")
        .expect("POD_NAMESPACE");
    assert_eq!(
        ns["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe"] {
        let port = &c[probe]["httpGet"]["port"];
        assert!(
            c["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .any(|p| p["name"] == *port),
            "{probe} port {port} is a named container port"
        );
    }
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(
        terms[0]["matchExpressions"][0],
        json!({"key": "node-role.kubernetes.io/edge", "operator": "DoesNotExist"})
    );
    // The service account the pod runs as is the one bound to the ClusterRole.
    let binding = find(&docs, "ClusterRoleBinding", "cloudcore").expect("binding");
    assert_eq!(binding["roleRef"]["name"], "cloudcore");
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": "cloudcore", "namespace": NAMESPACE})
    );
    let sa = find(&docs, "ServiceAccount", "cloudcore").expect("ServiceAccount");
    assert_eq!(sa["metadata"]["namespace"], NAMESPACE);
}

#[test]
fn service_follows_kubeedge_node_ports_and_the_values_overrides() {
    let docs = render_chart(installed_values());
    let svc = find(&docs, "Service", "cloudcore").expect("Service cloudcore");
    assert_eq!(svc["spec"]["type"], "NodePort");
    assert_eq!(
        ports(&svc["spec"]["ports"], "nodePort"),
        [30000, 30002, 30003, 30004]
    );
    let deploy = find(&docs, "Deployment", "cloudcore").expect("Deployment");
    assert_eq!(
        svc["spec"]["selector"],
        deploy["spec"]["template"]["metadata"]["labels"]
    );

    let mut v = installed_values();
    set(&mut v, "cloudCore.service.type", json!("LoadBalancer"));
    set(&mut v, "cloudCore.hostNetWork", json!(false));
    set(
        &mut v,
        "cloudCore.service.annotations",
        json!({"metallb.universe.tf/address-pool": "edge"}),
    );
    let docs = render_chart(v);
    let svc = find(&docs, "Service", "cloudcore").expect("Service");
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    assert_eq!(
        svc["metadata"]["annotations"]["metallb.universe.tf/address-pool"],
        "edge"
    );
    let pod =
        &find(&docs, "Deployment", "cloudcore").expect("Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], false);
    assert!(pod.get("dnsPolicy").is_none(), "{pod}");

    let mut v = installed_values();
    set(&mut v, "cloudCore.service.type", json!("ClusterIP"));
    for p in [
        "cloudhubNodePort",
        "cloudhubHttpsNodePort",
        "cloudstreamNodePort",
        "tunnelNodePort",
    ] {
        set(&mut v, &format!("cloudCore.service.{p}"), json!(""));
    }
    let docs = render_chart(v);
    let svc = find(&docs, "Service", "cloudcore").expect("Service");
    for p in svc["spec"]["ports"].as_array().expect("ports") {
        assert!(
            p.get("nodePort").is_none(),
            "ClusterIP has no nodePort: {p}"
        );
    }

    let mut v = installed_values();
    set(&mut v, "cloudCore.service.enable", json!(false));
    assert!(find(&render_chart(v), "Service", "cloudcore").is_none());
}

/// Every API call cloudcore makes, as (apiGroup, resource, verb); from controller/upstream.rs
/// (creates, queries, patches, deletes, tokens, events), downstream.rs (watches, pod list),
/// services.rs (service/endpoints/endpointslice watches), objectsync (records, orphans),
/// certs.rs and join/token_secret.rs (casecret, tokensecret), cloudstream (pod lookup),
/// leader.rs (the sync controller Lease).
const NEEDED: &[(&str, &str, &[&str])] = &[
    ("", "nodes", &["get", "list", "watch", "create", "patch"]),
    ("", "nodes/status", &["patch"]),
    ("", "pods", &["get", "list", "watch", "create", "delete"]),
    ("", "pods/status", &["patch"]),
    ("", "configmaps", &["get", "list", "watch"]),
    ("", "secrets", &["get", "list", "watch", "create", "update"]),
    ("", "persistentvolumes", &["get"]),
    ("", "persistentvolumeclaims", &["get"]),
    ("", "serviceaccounts/token", &["create"]),
    ("", "services", &["get", "list", "watch"]),
    ("", "endpoints", &["get", "list", "watch"]),
    ("", "events", &["create", "patch", "update"]),
    (
        "discovery.k8s.io",
        "endpointslices",
        &["get", "list", "watch"],
    ),
    ("storage.k8s.io", "volumeattachments", &["get"]),
    (
        "coordination.k8s.io",
        "leases",
        // patch: edge node Leases renewed by cloudcore (`cloud-lease`).
        &["get", "create", "update", "patch"],
    ),
    (
        "reliablesyncs.kubeedge.io",
        "objectsyncs",
        &["get", "list", "watch", "create", "delete"],
    ),
    (
        "reliablesyncs.kubeedge.io",
        "objectsyncs/status",
        &["update"],
    ),
    (
        "reliablesyncs.kubeedge.io",
        "clusterobjectsyncs",
        &["get", "list", "watch", "create", "delete"],
    ),
    (
        "reliablesyncs.kubeedge.io",
        "clusterobjectsyncs/status",
        &["update"],
    ),
    (
        "devices.kubeedge.io",
        "devices",
        &["get", "list", "watch", "patch"],
    ),
    (
        "devices.kubeedge.io",
        "devicemodels",
        &["get", "list", "watch"],
    ),
    // devices/status.rs (KubeEdge v1.23's DeviceStatus), devices/watch.rs
    (
        "devices.kubeedge.io",
        "devicestatuses",
        &["get", "list", "watch", "create", "patch"],
    ),
    // nodetask/mod.rs
    (
        "operations.kubeedge.io",
        "imageprepulljobs",
        &["get", "list", "watch"],
    ),
    (
        "operations.kubeedge.io",
        "imageprepulljobs/status",
        &["patch"],
    ),
    (
        "operations.kubeedge.io",
        "nodeupgradejobs",
        &["get", "list", "watch"],
    ),
    (
        "operations.kubeedge.io",
        "nodeupgradejobs/status",
        &["patch"],
    ),
    (
        "operations.kubeedge.io",
        "configupdatejobs",
        &["get", "list", "watch"],
    ),
    (
        "operations.kubeedge.io",
        "configupdatejobs/status",
        &["patch"],
    ),
    // router/ruleset.rs (watches), router/status.rs (get, patch)
    (
        "rules.kubeedge.io",
        "rules",
        &["get", "list", "watch", "patch"],
    ),
    (
        "rules.kubeedge.io",
        "ruleendpoints",
        &["get", "list", "watch"],
    ),
];

#[test]
fn cluster_role_covers_every_call_cloudcore_makes() {
    let docs = render_chart(installed_values());
    let role = find(&docs, "ClusterRole", "cloudcore").expect("ClusterRole cloudcore");
    let rules = role["rules"].as_array().expect("rules");
    let has = |list: &Value, want: &str| {
        list.as_array()
            .expect("rule list")
            .iter()
            .any(|x| x == want || x == "*")
    };
    let mut missing = Vec::new();
    for (group, resource, verbs) in NEEDED {
        for verb in *verbs {
            let covered = rules.iter().any(|r| {
                has(&r["apiGroups"], group)
                    && has(&r["resources"], resource)
                    && has(&r["verbs"], verb)
            });
            if !covered {
                missing.push(format!("{group}/{resource}:{verb}"));
            }
        }
    }
    assert!(missing.is_empty(), "ClusterRole misses {missing:?}");
}

/// Every CRD file of `manifests/crds` is in the chart's `crds/` unchanged, and renders.
#[test]
fn chart_ships_the_crds_unchanged() {
    let files: &[(&str, &[&str])] = &[
        (
            "devices-crds.yaml",
            &[
                "devices.devices.kubeedge.io",
                "devicemodels.devices.kubeedge.io",
                "devicestatuses.devices.kubeedge.io",
            ],
        ),
        (
            "reliablesyncs-crds.yaml",
            &[
                "objectsyncs.reliablesyncs.kubeedge.io",
                "clusterobjectsyncs.reliablesyncs.kubeedge.io",
            ],
        ),
        (
            "router-crds.yaml",
            &["rules.rules.kubeedge.io", "ruleendpoints.rules.kubeedge.io"],
        ),
        (
            "operations-crds.yaml",
            &[
                "imageprepulljobs.operations.kubeedge.io",
                "nodeupgradejobs.operations.kubeedge.io",
                "configupdatejobs.operations.kubeedge.io",
            ],
        ),
    ];
    let docs = render_chart(installed_values());
    for (file, names) in files {
        let chart_crds = read(&chart_dir().join("crds").join(file));
        let source = read(&manifests_dir().join("crds").join(file));
        assert_eq!(
            chart_crds, source,
            "copy manifests/crds/{file} to the chart's crds/"
        );
        for name in *names {
            assert!(
                find(&docs, "CustomResourceDefinition", name).is_some(),
                "CRD {name}"
            );
        }
    }
}

/// Off by default as in KubeEdge; enabled, cloudcore listens on 9443 and the Deployment and
/// Service declare that port.
#[test]
fn the_router_is_off_by_default_and_its_port_is_declared_when_on() {
    let config = |docs: &[Value]| {
        let cm = find(docs, "ConfigMap", "cloudcore").expect("ConfigMap cloudcore");
        let text = cm["data"]["cloudcore.yaml"]
            .as_str()
            .expect("cloudcore.yaml");
        CloudCoreConfig::from_yaml(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    };
    let docs = render_chart(installed_values());
    assert!(!config(&docs).modules.router.enable);
    let svc = find(&docs, "Service", "cloudcore").expect("Service");
    assert!(!ports(&svc["spec"]["ports"], "port").contains(&9443));

    let mut v = installed_values();
    set(&mut v, "cloudCore.modules.router.enable", json!(true));
    set(&mut v, "cloudCore.service.routerNodePort", json!("30443"));
    let docs = render_chart(v);
    let router = config(&docs).modules.router;
    assert!(router.enable);
    assert_eq!((router.port, router.rest_timeout), (9443, 60));
    let svc = find(&docs, "Service", "cloudcore").expect("Service");
    assert!(ports(&svc["spec"]["ports"], "targetPort").contains(&9443));
    assert!(ports(&svc["spec"]["ports"], "nodePort").contains(&30443));
    let deploy = find(&docs, "Deployment", "cloudcore").expect("Deployment");
    let container = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert!(ports(&container["ports"], "containerPort").contains(&9443));
}

#[test]
fn renderer_trims_and_nests_like_go_templates() {
    let scope = Scope {
        values: json!({"a": {"on": true, "off": false, "l": ["x", "z"], "n": 3}}),
        app_version: "9".into(),
    };
    let t = "k:\n  {{- toYaml .Values.a.l | nindent 2 }}\nn: {{ .Values.a.n }}\n\
             {{- if .Values.a.on }}\non: yes\n{{- if .Values.a.off }}\noff: yes\n{{- end }}\n{{- end }}\n\
             v: {{ .Chart.AppVersion }}-{{ .Release.Namespace }}\n";
    assert_eq!(
        render(t, &scope),
        "k:\n  - x\n  - z\nn: 3\non: yes\nv: 9-kubeedge\n"
    );
    for (cond, want) in [
        ("and .Values.a.on (eq .Values.a.n \"3\")", false), // 3 is a number, not "3"
        ("and .Values.a.on .Values.a.l", true),
        ("and .Values.a.on .Values.a.off", false),
        ("or .Values.a.off (and .Values.a.on (.Values.a.l))", true),
        ("or .Values.a.off (and .Values.a.on .Values.a.off)", false),
    ] {
        assert_eq!(condition(cond, &scope), want, "{cond}");
    }
}

/// The pod spec's volume named by the mount at `path` of container `c`, if any.
fn volume_at<'a>(pod: &'a Value, c: &Value, path: &str) -> Option<&'a Value> {
    let mount = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"] == path)?;
    pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
}

/// Root with only NET_ADMIN/NET_RAW, in the host's network namespace, sharing its iptables lock.
fn assert_can_run_iptables(pod: &Value, c: &Value) {
    assert_eq!(pod["hostNetwork"], true, "{pod}");
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    let sc = &c["securityContext"];
    assert_eq!(sc["capabilities"]["add"], json!(["NET_ADMIN", "NET_RAW"]));
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(
        sc["runAsUser"], 0,
        "added capabilities are effective only for root"
    );
    assert_ne!(sc["runAsNonRoot"], true);
    assert_ne!(sc["privileged"], true);
    let lock = volume_at(pod, c, "/run/xtables.lock").expect("xtables lock mounted");
    assert_eq!(
        lock["hostPath"],
        json!({"path": "/run/xtables.lock", "type": "FileOrCreate"})
    );
}

fn cloudcore_pod(docs: &[Value]) -> &Value {
    &find(docs, "Deployment", "cloudcore").expect("Deployment")["spec"]["template"]["spec"]
}

fn iptables_config(docs: &[Value]) -> cloudcore::config::IptablesManagerConfig {
    let cm = find(docs, "ConfigMap", "cloudcore").expect("ConfigMap");
    let text = cm["data"]["cloudcore.yaml"]
        .as_str()
        .expect("cloudcore.yaml");
    CloudCoreConfig::from_yaml(text)
        .expect("loads")
        .modules
        .iptables_manager
}

#[test]
fn iptables_manager_defaults_to_an_external_daemonset_running_cloudcore_iptables_manager() {
    // KubeEdge's default: enabled, mode external; cloudcore itself stays unprivileged.
    let docs = render_chart(installed_values());
    let m = iptables_config(&docs);
    assert!(m.enable);
    assert_eq!(m.mode, cloudcore::config::IptablesMode::External);
    let pod = cloudcore_pod(&docs);
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert!(c["securityContext"]["capabilities"]["add"].is_null());
    assert!(volume_at(pod, c, "/run/xtables.lock").is_none());

    let ds = find(&docs, "DaemonSet", "cloud-iptables-manager").expect("DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let ds_pod = &ds["spec"]["template"]["spec"];
    let dc = &ds_pod["containers"][0];
    assert_can_run_iptables(ds_pod, dc);
    assert_eq!(dc["image"], c["image"], "the same cloudcore image");
    let args: Vec<&str> = dc["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg"))
        .collect();
    assert_eq!(args[0], "iptables-manager");
    // It reads the same cloudcore.yaml (ConfigMap cloudcore) as the Deployment.
    let config = args[args
        .iter()
        .position(|a| *a == "--config")
        .expect("--config")
        + 1];
    let dir = config.rsplit_once('/').expect("config path").0;
    let conf = volume_at(ds_pod, dc, dir).expect("config mounted");
    assert_eq!(conf["configMap"]["name"], "cloudcore");
    assert_eq!(config, cloudcore::config::DEFAULT_CONFIG_PATH);
    assert_eq!(
        ds_pod["affinity"], pod["affinity"],
        "on cloud nodes, not edges"
    );

    // Its service account may watch the tunnel port ConfigMap, and nothing else.
    let sa = ds_pod["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    assert_ne!(sa, "cloudcore");
    let binding = find(&docs, "RoleBinding", "iptables-manager").expect("RoleBinding");
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE})
    );
    assert!(find(&docs, "ServiceAccount", sa).is_some());
    let role_name = binding["roleRef"]["name"].as_str().expect("role");
    let role = find(&docs, "Role", role_name).expect("Role");
    assert_eq!(
        role["metadata"]["namespace"],
        cloudcore::cloudstream::TUNNEL_PORT_NAMESPACE
    );
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}])
    );
}

#[test]
fn iptables_manager_internal_runs_in_cloudcore_with_net_admin_and_the_host_lock() {
    let mut v = installed_values();
    set(&mut v, "iptablesManager.mode", json!("internal"));
    // hostNetwork even when cloudCore.hostNetWork is off: the rules belong to the host.
    set(&mut v, "cloudCore.hostNetWork", json!(false));
    let docs = render_chart(v);
    let m = iptables_config(&docs);
    assert!(m.enable);
    assert_eq!(m.mode, cloudcore::config::IptablesMode::Internal);
    let pod = cloudcore_pod(&docs);
    let c = &pod["containers"][0];
    assert_can_run_iptables(pod, c);
    let env = c["env"].as_array().expect("env");
    let ip = env.iter().find(|e| e["name"] == "POD_IP").expect("POD_IP");
    assert_eq!(ip["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
    assert!(find(&docs, "DaemonSet", "cloud-iptables-manager").is_none());
    assert!(find(&docs, "Role", "iptables-manager").is_none());

    // Disabled: no rules anywhere, cloudcore unprivileged, no lock mount.
    let mut v = installed_values();
    set(&mut v, "iptablesManager.enable", json!(false));
    let docs = render_chart(v);
    assert!(!iptables_config(&docs).enable);
    let pod = cloudcore_pod(&docs);
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert!(c["securityContext"]["capabilities"]["add"].is_null());
    assert!(volume_at(pod, c, "/run/xtables.lock").is_none());
    assert_eq!(pod["hostNetwork"], true, "cloudCore.hostNetWork's default");
    assert!(find(&docs, "DaemonSet", "cloud-iptables-manager").is_none());
}

#[test]
fn stream_clients_are_verified_against_the_service_account_ca_or_a_stream_ca_secret() {
    use cloudcore::cloudstream::SERVICE_ACCOUNT_CA;
    let cfg_of = |docs: &[Value]| {
        let cm = find(docs, "ConfigMap", "cloudcore").expect("ConfigMap");
        let text = cm["data"]["cloudcore.yaml"]
            .as_str()
            .expect("cloudcore.yaml");
        CloudCoreConfig::from_yaml(text).expect("loads")
    };
    // Default: no stream CA file, the service-account token (and its ca.crt) mounted, no opt-out.
    let docs = render_chart(installed_values());
    let cfg = cfg_of(&docs);
    let stream = &cfg.modules.cloud_stream;
    assert!(stream.enable && !stream.insecure_skip_client_verify);
    let pod =
        &find(&docs, "Deployment", "cloudcore").expect("Deployment")["spec"]["template"]["spec"];
    let sa = find(&docs, "ServiceAccount", "cloudcore").expect("ServiceAccount");
    assert_ne!(pod["automountServiceAccountToken"], false);
    assert_ne!(sa["automountServiceAccountToken"], false);
    let mounts = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts");
    for m in mounts {
        let path = m["mountPath"].as_str().expect("mountPath");
        assert!(
            !stream.tls_stream_ca_file.starts_with(path) && !SERVICE_ACCOUNT_CA.starts_with(path),
            "{path} would hide the service-account CA or supply a stream CA"
        );
    }

    // streamCASecret: its streamCA.crt is mounted where tlsStreamCAFile points.
    let mut v = installed_values();
    set(
        &mut v,
        "cloudCore.modules.cloudStream.streamCASecret",
        json!("cloudcore"),
    );
    let docs = render_chart(v);
    let cfg = cfg_of(&docs);
    let pod =
        &find(&docs, "Deployment", "cloudcore").expect("Deployment")["spec"]["template"]["spec"];
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == "stream-ca")
        .expect("stream-ca mount");
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "stream-ca")
        .expect("stream-ca volume");
    assert_eq!(volume["secret"]["secretName"], "cloudcore");
    let item = &volume["secret"]["items"][0];
    assert_eq!(item["key"], "streamCA.crt");
    assert_eq!(
        format!(
            "{}/{}",
            mount["mountPath"].as_str().expect("mountPath"),
            item["path"].as_str().expect("path")
        ),
        cfg.modules.cloud_stream.tls_stream_ca_file
    );
}

#[test]
fn a_stream_cert_secret_is_mounted_where_cloudcore_reads_the_stream_certificate() {
    let cfg_of = |docs: &[Value]| {
        let cm = find(docs, "ConfigMap", "cloudcore").expect("ConfigMap");
        let text = cm["data"]["cloudcore.yaml"]
            .as_str()
            .expect("cloudcore.yaml");
        CloudCoreConfig::from_yaml(text).expect("loads")
    };
    // Default: nothing mounted where the stream certificate would be read.
    let docs = render_chart(installed_values());
    let stream = cfg_of(&docs).modules.cloud_stream;
    let pod = cloudcore_pod(&docs);
    let c = &pod["containers"][0];
    for m in c["volumeMounts"].as_array().expect("mounts") {
        let path = m["mountPath"].as_str().expect("mountPath");
        assert!(
            !stream.tls_stream_cert_file.starts_with(path),
            "{path} would supply a stream certificate"
        );
    }

    // KubeEdge's Secret cloudcore holds streamCA.crt, stream.crt and stream.key: one Secret
    // can serve both values.
    let mut v = installed_values();
    for key in ["streamCASecret", "streamCertSecret"] {
        set(
            &mut v,
            &format!("cloudCore.modules.cloudStream.{key}"),
            json!("cloudcore"),
        );
    }
    let docs = render_chart(v);
    let stream = cfg_of(&docs).modules.cloud_stream;
    let pod = cloudcore_pod(&docs);
    let c = &pod["containers"][0];
    let mounted_file = |path: &str| {
        let (dir, file) = path.rsplit_once('/').expect("a file path");
        let mount = c["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .find(|m| m["mountPath"] == dir)
            .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
        assert_eq!(mount["readOnly"], true);
        let volume = volume_at(pod, c, dir).expect("a volume");
        let item = volume["secret"]["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|i| i["path"] == file)
            .unwrap_or_else(|| panic!("{file} not in {volume}"))
            .clone();
        (volume["secret"]["secretName"].clone(), item["key"].clone())
    };
    assert_eq!(
        mounted_file(&stream.tls_stream_cert_file),
        (json!("cloudcore"), json!("stream.crt"))
    );
    assert_eq!(
        mounted_file(&stream.tls_stream_private_key_file),
        (json!("cloudcore"), json!("stream.key"))
    );
    assert_eq!(
        mounted_file(&stream.tls_stream_ca_file),
        (json!("cloudcore"), json!("streamCA.crt"))
    );
    // The tunnel certificate files stay absent, so the tunnel keeps cloudhub's certificate
    // (ServerIdentity::load sees neither file).
    let volume = volume_at(pod, c, "/etc/kubeedge/certs").expect("stream-cert volume");
    for f in [
        &stream.tls_tunnel_cert_file,
        &stream.tls_tunnel_private_key_file,
    ] {
        let name = f.rsplit_once('/').expect("path").1;
        assert!(
            !volume["secret"]["items"]
                .as_array()
                .expect("items")
                .iter()
                .any(|i| i["path"] == name),
            "{f} would be mounted"
        );
    }
}

/// The plain manifests that come from the chart: each file and the kinds it holds.
const PLAIN: &[(&str, &[&str])] = &[
    (
        "rbac.yaml",
        &[
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ],
    ),
    (
        "cloudcore.yaml",
        &["ConfigMap", "Deployment", "Service", "DaemonSet"],
    ),
];

fn documents(text: &str, what: &str) -> Vec<Value> {
    text.split("\n---")
        .filter(|doc| {
            doc.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|doc| yaml(doc, what))
        .collect()
}

/// `manifests/rbac.yaml` and `manifests/cloudcore.yaml` are the chart rendered with its default
/// values (`UPDATE_MANIFESTS=1 cargo test -p cloudcore --test helm_chart` rewrites them).
#[test]
fn plain_manifests_are_the_chart_with_its_default_values() {
    let docs = render_chart(default_values());
    let update = std::env::var_os("UPDATE_MANIFESTS").is_some();
    for (file, kinds) in PLAIN {
        let want: Vec<Value> = docs
            .iter()
            .filter(|d| kinds.iter().any(|k| d["kind"] == *k))
            .cloned()
            .collect();
        assert!(!want.is_empty(), "{file}: nothing rendered");
        let path = manifests_dir().join(file);
        if update {
            let mut text = format!(
                "# Generated from charts/cloudcore with its default values by\n\
                 # `UPDATE_MANIFESTS=1 cargo test -p cloudcore --test helm_chart`: change the chart,\n\
                 # then regenerate. Kinds: {}.\n",
                kinds.join(", ")
            );
            for d in &want {
                text.push_str("---\n");
                text.push_str(&serde_saphyr::to_string(d).expect("YAML"));
            }
            std::fs::write(&path, text).expect("write manifest");
        }
        let got = documents(&read(&path), file);
        assert!(
            got == want,
            "manifests/{file} is not the chart rendered with its default values: run \
             UPDATE_MANIFESTS=1 cargo test -p cloudcore --test helm_chart"
        );
    }
    let ns = documents(&read(&manifests_dir().join("namespace.yaml")), "namespace");
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0]["kind"], "Namespace");
    assert_eq!(ns[0]["metadata"]["name"], NAMESPACE);
    for (file, _) in PLAIN {
        for d in documents(&read(&manifests_dir().join(file)), file) {
            let cluster_scoped = ["ClusterRole", "ClusterRoleBinding"]
                .contains(&d["kind"].as_str().unwrap_or_default());
            if !cluster_scoped {
                assert_eq!(
                    d["metadata"]["namespace"], NAMESPACE,
                    "{file}: {}",
                    d["metadata"]["name"]
                );
            }
        }
    }
}

/// `manifests/edgecore.service` runs the edgecore `edgecore join` configures, as root, and
/// restarts it.
#[test]
fn the_edgecore_unit_runs_the_joined_configuration() {
    let unit = read(&manifests_dir().join("edgecore.service"));
    let value = |section: &str, key: &str| -> Option<String> {
        let mut current = "";
        for line in unit.lines().map(str::trim) {
            if line.starts_with('[') {
                current = line;
            } else if current == section
                && let Some((k, v)) = line.split_once('=')
                && k.trim() == key
            {
                return Some(v.trim().to_string());
            }
        }
        None
    };
    assert_eq!(
        value("[Service]", "ExecStart").as_deref(),
        Some("/usr/local/bin/edgecore --config /etc/kubeedge/config/edgecore.yaml")
    );
    assert_eq!(value("[Service]", "Restart").as_deref(), Some("always"));
    assert_eq!(
        value("[Install]", "WantedBy").as_deref(),
        Some("multi-user.target")
    );
    assert!(value("[Unit]", "After").is_some_and(|a| a.contains("network-online.target")));
}

/// The sample workloads run on edge nodes: pods select the edge label cloudcore watches and
/// tolerate the edge taint; the device sample is a complete v1beta1 pair.
#[test]
fn sample_workloads_target_edge_nodes() {
    let samples = manifests_dir().join("samples");
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(&samples).expect("manifests/samples") {
        let path = entry.expect("entry").path();
        for d in documents(&read(&path), &path.display().to_string()) {
            kinds.push(d["kind"].as_str().unwrap_or_default().to_string());
            if let Some(pod) = d.pointer("/spec/template/spec") {
                assert!(
                    pod["nodeSelector"]
                        .get(kubeedge_shared::constants::EDGE_NODE_LABEL)
                        .is_some(),
                    "{}: pods must select edge nodes",
                    path.display()
                );
                assert!(
                    pod["tolerations"].as_array().is_some_and(|t| t
                        .iter()
                        .any(|t| t["key"] == kubeedge_shared::constants::EDGE_NODE_LABEL)),
                    "{}: pods must tolerate the edge taint",
                    path.display()
                );
            }
            if d["kind"] == "Device" {
                assert_eq!(d["apiVersion"], "devices.kubeedge.io/v1beta1");
                assert!(d.pointer("/spec/deviceModelRef/name").is_some());
                assert!(d.pointer("/spec/protocol/protocolName").is_some());
            }
        }
    }
    kinds.sort();
    assert_eq!(kinds, ["DaemonSet", "Deployment", "Device", "DeviceModel"]);
}

/// The metric names a PromQL expression reads: identifiers that are not functions, keywords
/// or label names (matchers, `by (…)` and `without (…)` groups and strings removed first).
fn promql_metrics(expr: &str) -> Vec<String> {
    let mut text = String::new();
    let (mut depth_brace, mut in_string) = (0usize, false);
    for c in expr.chars() {
        match c {
            '"' => in_string = !in_string,
            _ if in_string => {}
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_brace += 1,
            ']' => depth_brace -= 1,
            _ if depth_brace > 0 => {}
            c => text.push(c),
        }
    }
    // `by (a, b)` / `without (a)`: label lists.
    for kw in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        while let Some(i) = find_word(&text, kw) {
            let after = &text[i + kw.len()..];
            let close = after.find(')').expect("label list end");
            text = format!("{}{}", &text[..i], &after[close + 1..]);
        }
    }
    let keywords = ["and", "or", "unless", "bool", "offset"];
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts = (c.is_ascii_alphabetic() || c == '_' || c == ':')
            && (i == 0 || !(chars[i - 1].is_ascii_alphanumeric() || chars[i - 1] == '.'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len()
            && (chars[j].is_ascii_alphanumeric() || chars[j] == '_' || chars[j] == ':')
        {
            j += 1;
        }
        let word: String = chars[i..j].iter().collect();
        let next = chars[j..].iter().find(|c| !c.is_whitespace());
        if next != Some(&'(') && !keywords.contains(&word.as_str()) {
            out.push(word);
        }
        i = j;
    }
    out
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    text.match_indices(word).map(|(i, _)| i).find(|&i| {
        let before = text[..i].chars().last();
        let after = text[i + word.len()..].trim_start().chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && after == Some('(')
    })
}

#[test]
fn promql_metric_names_are_found() {
    assert_eq!(
        promql_metrics(
            "histogram_quantile(0.99, sum by (le, resource) (rate(a_bucket{code!=\"2xx\"}[5m]))) / clamp_min(sum(b), 1)"
        ),
        ["a_bucket", "b"]
    );
    assert_eq!(
        promql_metrics("topk(10, sum without (x) (rate(c_total[1h])))"),
        ["c_total"]
    );
}

#[test]
fn monitoring_is_off_by_default_and_the_dashboard_reads_only_exported_metrics() {
    let docs = render_chart(installed_values());
    assert!(find(&docs, "ServiceMonitor", "cloudcore").is_none());
    assert!(find(&docs, "ConfigMap", "cloudcore-dashboard").is_none());

    let mut v = installed_values();
    set(&mut v, "cloudCore.serviceMonitor.enable", json!(true));
    set(
        &mut v,
        "cloudCore.serviceMonitor.labels",
        json!({"release": "prom"}),
    );
    set(&mut v, "cloudCore.grafanaDashboard.enable", json!(true));
    let docs = render_chart(v);
    let sm = find(&docs, "ServiceMonitor", "cloudcore").expect("ServiceMonitor");
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    let svc = find(&docs, "Service", "cloudcore-metrics").expect("Service cloudcore-metrics");
    // The ServiceMonitor selects that Service (and not the edges' one), on its metrics port.
    for (k, want) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&svc["metadata"]["labels"][k], want, "label {k}");
    }
    let edges_svc = find(&docs, "Service", "cloudcore").expect("Service cloudcore");
    assert!(
        sm["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
            .iter()
            .any(|(k, want)| &edges_svc["metadata"]["labels"][k] != want),
        "the ServiceMonitor would select the edges' Service too"
    );
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    let port = &svc["spec"]["ports"][0];
    assert_eq!(port["name"], endpoint["port"]);
    // ... which is where cloudcore serves /metrics, on its pods.
    let cm = find(&docs, "ConfigMap", "cloudcore").expect("ConfigMap cloudcore");
    let cfg = CloudCoreConfig::from_yaml(cm["data"]["cloudcore.yaml"].as_str().unwrap()).unwrap();
    let monitor: std::net::SocketAddr = cfg
        .common_config
        .monitor_server
        .bind_address
        .parse()
        .unwrap();
    assert_eq!(port["targetPort"].as_u64(), Some(u64::from(monitor.port())));
    let deploy = find(&docs, "Deployment", "cloudcore").expect("Deployment cloudcore");
    assert_eq!(
        svc["spec"]["selector"],
        deploy["spec"]["template"]["metadata"]["labels"]
    );

    // The dashboard ConfigMap carries the file as it is.
    let dash_cm = find(&docs, "ConfigMap", "cloudcore-dashboard").expect("dashboard ConfigMap");
    assert_eq!(dash_cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let file = read(&chart_dir().join("dashboards/cloudcore.json"));
    let shipped: Value = serde_json::from_str(dash_cm["data"]["cloudcore.json"].as_str().unwrap())
        .expect("dashboard JSON in the ConfigMap");
    let dashboard: Value = serde_json::from_str(&file).expect("dashboards/cloudcore.json");
    assert_eq!(shipped, dashboard);

    // Every query reads metrics cloudcore exports.
    let exported = cloudcore::metrics::exported_names();
    let mut read_names = std::collections::BTreeSet::new();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            queries += 1;
            let names = promql_metrics(expr);
            assert!(!names.is_empty(), "{expr}: reads no metric");
            for name in names {
                assert!(
                    exported.contains(&name),
                    "panel {:?}: {name} is not a metric cloudcore exports ({expr})",
                    panel["title"]
                );
                read_names.insert(name);
            }
        }
    }
    assert!(queries >= 10, "{queries} queries");
    // What an operator of a fleet looks at first.
    for needed in [
        "cloudhub_connected_nodes",
        "cloudhub_node_queue_depth_bucket",
        "cloudhub_ack_latency_seconds_bucket",
        "cloudhub_message_bytes_total",
        "cloudhub_node_message_bytes_total",
        "edgecontroller_resync_duration_seconds_bucket",
        "cloudcore_apiserver_requests_total",
    ] {
        assert!(
            read_names.contains(needed),
            "the dashboard shows no {needed}"
        );
    }
}
