//! Metrics of edgecore's modules (eventbus, devicetwin), rendered on the edge's `/metrics`
//! after the kubelet's own (see `edgestream/metrics.rs`).

use prometheus_client::registry::Registry;
use std::sync::Mutex;

#[derive(Default)]
pub struct ModuleMetrics {
    registry: Mutex<Registry>,
}

impl ModuleMetrics {
    /// Lets a module add its metrics.
    pub fn register(&self, f: impl FnOnce(&mut Registry)) {
        f(&mut self.registry.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

impl kubeedge_edged::MetricsSource for ModuleMetrics {
    /// Appends the metrics in the text format (without OpenMetrics' `# EOF`, so the result can
    /// be followed by more).
    fn render(&self, out: &mut String) {
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &registry).is_ok() {
            out.push_str(text.trim_end_matches("# EOF\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_edged::MetricsSource;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn modules_render_their_metrics_without_eof() {
        let m = ModuleMetrics::default();
        let c: Counter = Counter::default();
        c.inc();
        m.register(|r| r.register("demo_things", "Things", c.clone()));
        let mut out = String::from("kubelet_x 1\n");
        m.render(&mut out);
        assert!(out.starts_with("kubelet_x 1\n"));
        assert!(out.contains("demo_things_total 1"), "{out}");
        assert!(!out.contains("# EOF"));
    }
}
