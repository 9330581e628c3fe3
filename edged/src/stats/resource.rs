//! `/metrics/resource` in the Prometheus text format as the kubelet's resource metrics
//! collector writes it: families sorted by name, samples by label values, values as Go's
//! `strconv.FormatFloat(v, 'g', -1, 64)`, and each sample's timestamp (milliseconds) the
//! moment its reading was taken. Also the few kubelet metrics `/metrics` has here.

use super::sample::Snapshot;
use std::fmt::Write as _;
use std::time::SystemTime;

/// A float as Go's `strconv.FormatFloat(v, 'g', -1, 64)` (Prometheus' `+Inf`/`-Inf`/`NaN`).
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Shortest round-trip digits and the decimal exponent.
    let e = format!("{v:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..21).contains(&exp) && exp < 6 {
        return format!("{v}");
    }
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

fn millis(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One sample: labels, value and timestamp.
type Sample = (Vec<(&'static str, String)>, f64, Option<SystemTime>);

/// One family of samples.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<Sample>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Self {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn write(mut self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        self.samples.sort_by(|a, b| {
            let key = |s: &Sample| s.0.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>();
            key(a).cmp(&key(b))
        });
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (labels, v, t) in self.samples {
            out.push_str(self.name);
            if !labels.is_empty() {
                let l: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                let _ = write!(out, "{{{}}}", l.join(","));
            }
            let _ = write!(out, " {}", go_float(v));
            if let Some(t) = t {
                let _ = write!(out, " {}", millis(t));
            }
            out.push('\n');
        }
    }
}

fn seconds(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

/// `/metrics/resource`.
pub fn render(s: &Snapshot) -> String {
    let mut c_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
    );
    let mut c_mem = Family::new(
        "container_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the container in bytes",
    );
    let mut c_start = Family::new(
        "container_start_time_seconds",
        "gauge",
        "[STABLE] Start time of the container since unix epoch in seconds",
    );
    let mut n_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
    );
    let mut n_mem = Family::new(
        "node_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the node in bytes",
    );
    let mut p_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
    );
    let mut p_mem = Family::new(
        "pod_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the pod in bytes",
    );
    let mut res_err = Family::new(
        "resource_scrape_error",
        "gauge",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
    );
    let mut scrape_err = Family::new(
        "scrape_error",
        "gauge",
        "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
    );
    if let Some(c) = &s.node.cpu
        && let Some(ns) = c.usage_core_nanos
    {
        n_cpu.samples.push((vec![], seconds(ns), Some(c.time)));
    }
    if let Some(m) = &s.node.memory
        && let Some(ws) = m.working_set
    {
        n_mem.samples.push((vec![], ws as f64, Some(m.time)));
    }
    for p in &s.pods {
        let pod_labels = || vec![("namespace", p.namespace.clone()), ("pod", p.name.clone())];
        if let Some(c) = &p.cpu
            && let Some(ns) = c.usage_core_nanos
        {
            p_cpu
                .samples
                .push((pod_labels(), seconds(ns), Some(c.time)));
        }
        if let Some(m) = &p.memory
            && let Some(ws) = m.working_set
        {
            p_mem.samples.push((pod_labels(), ws as f64, Some(m.time)));
        }
        for c in &p.containers {
            let labels = || {
                vec![
                    ("container", c.name.clone()),
                    ("namespace", p.namespace.clone()),
                    ("pod", p.name.clone()),
                ]
            };
            if let Some(x) = &c.cpu
                && let Some(ns) = x.usage_core_nanos
            {
                c_cpu.samples.push((labels(), seconds(ns), Some(x.time)));
            }
            if let Some(m) = &c.memory
                && let Some(ws) = m.working_set
            {
                c_mem.samples.push((labels(), ws as f64, Some(m.time)));
            }
            let start = c
                .start
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            if start > 0.0 {
                c_start.samples.push((labels(), start, Some(c.start)));
            }
        }
    }
    let err = if s.scrape_error { 1.0 } else { 0.0 };
    res_err.samples.push((vec![], err, None));
    scrape_err.samples.push((vec![], err, None));
    let mut out = String::new();
    for f in [
        c_cpu, c_mem, c_start, n_cpu, n_mem, p_cpu, p_mem, res_err, scrape_err,
    ] {
        f.write(&mut out);
    }
    out
}

/// `/metrics`: the kubelet's pod and container counts.
pub fn render_kubelet(s: &Snapshot) -> String {
    let mut pods = Family::new(
        "kubelet_running_pods",
        "gauge",
        "[ALPHA] Number of pods that have a running pod sandbox",
    );
    pods.samples.push((vec![], s.pods.len() as f64, None));
    let mut containers = Family::new(
        "kubelet_running_containers",
        "gauge",
        "[ALPHA] Number of containers currently running",
    );
    let running: usize = s.pods.iter().map(|p| p.containers.len()).sum();
    containers.samples.push((
        vec![("container_state", "running".to_string())],
        running as f64,
        None,
    ));
    let mut out = String::new();
    containers.write(&mut out);
    pods.write(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::super::sample::tests::{at, container};
    use super::super::sample::{Cpu, Memory, NodeSample, PodSample};
    use super::*;

    #[test]
    fn floats_are_written_as_go_does() {
        for (v, go) in [
            (0.0, "0"),
            (1.0, "1"),
            (1234.5, "1234.5"),
            (0.001, "0.001"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (100000.0, "100000"),
            (1234567.0, "1.234567e+06"),
            (12_000_000.0, "1.2e+07"),
            (1.7e9, "1.7e+09"),
            (-2.5, "-2.5"),
            (1e21, "1e+21"),
            (f64::INFINITY, "+Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(go_float(v), go, "{v}");
        }
    }

    #[test]
    fn resource_metrics_as_the_kubelet_writes_them() {
        let mut pod = PodSample {
            name: "web".into(),
            namespace: "ns\"1".into(),
            uid: "u".into(),
            start: at(1_700_000_000),
            containers: vec![
                container("side", 2_500_000_000, 2048),
                container("app", 1_000_000, 12_000_000),
            ],
            cpu: None,
            memory: None,
        };
        pod.sum_containers();
        let snap = Snapshot {
            node: NodeSample {
                name: "n".into(),
                boot: at(1),
                cpu: Some(Cpu {
                    time: at(1_700_000_300),
                    usage_core_nanos: Some(1_234_500_000_000),
                    usage_nano_cores: Some(5),
                }),
                memory: Some(Memory {
                    time: at(1_700_000_301),
                    working_set: Some(1_000_000_000),
                    usage: None,
                    available: None,
                    rss: None,
                    page_faults: None,
                    major_page_faults: None,
                }),
                fs: None,
            },
            pods: vec![pod],
            scrape_error: false,
        };
        let text = render(&snap);
        let expected = r#"# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container="app",namespace="ns\"1",pod="web"} 0.001 1700000200000
container_cpu_usage_seconds_total{container="side",namespace="ns\"1",pod="web"} 2.5 1700000200000
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container="app",namespace="ns\"1",pod="web"} 1.2e+07 1700000201000
container_memory_working_set_bytes{container="side",namespace="ns\"1",pod="web"} 2048 1700000201000
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container="app",namespace="ns\"1",pod="web"} 1.7000001e+09 1700000100000
container_start_time_seconds{container="side",namespace="ns\"1",pod="web"} 1.7000001e+09 1700000100000
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 1234.5 1700000300000
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 1e+09 1700000301000
# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace="ns\"1",pod="web"} 2.501 1700000200000
# HELP pod_memory_working_set_bytes [STABLE] Current working set of the pod in bytes
# TYPE pod_memory_working_set_bytes gauge
pod_memory_working_set_bytes{namespace="ns\"1",pod="web"} 1.2002048e+07 1700000201000
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE scrape_error gauge
scrape_error 0
"#;
        assert_eq!(text, expected);
        let kubelet = render_kubelet(&snap);
        assert!(kubelet.contains("kubelet_running_containers{container_state=\"running\"} 2\n"));
        assert!(kubelet.contains("kubelet_running_pods 1\n"));
    }
}
