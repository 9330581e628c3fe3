//! Helpers the benchmark binaries share.

use std::time::Duration;

/// The command line of a benchmark configured by environment variables: `--help` (or `-h`)
/// prints the binary's documentation (the `//!` lines of `source`, its own file) and exits;
/// any other argument is refused with a pointer to it.
pub fn env_configured_cli(source: &str) {
    let name = std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "benchmark".into());
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", doc_of(source));
        std::process::exit(0);
    }
    if let Some(a) = args.first() {
        eprintln!(
            "{name}: unexpected argument {a:?}: settings come from environment variables (see {name} --help)"
        );
        std::process::exit(2);
    }
}

/// The module documentation (`//!` lines) of a source file, as text.
pub fn doc_of(source: &str) -> String {
    source
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A numeric setting from the environment (`BENCH_…`), or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `p` quantile (0–1) of sorted durations (zero when there are none).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// One scrape of a Prometheus/OpenMetrics text endpoint: series (`name{labels}` as written)
/// → value. Counters are read under their `_total` names.
#[derive(Debug, Clone, Default)]
pub struct Scrape(pub std::collections::BTreeMap<String, f64>);

impl Scrape {
    /// `GET /metrics` from `addr` (`host:port`); `None` when it does not answer in 5 s.
    pub async fn fetch(addr: &str) -> Option<Scrape> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let fetch = async {
            let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.ok()?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await.ok()?;
            let text = String::from_utf8_lossy(&buf);
            let body = text.split_once("\r\n\r\n").map_or(&*text, |(_, b)| b);
            Some(Scrape::parse(body))
        };
        tokio::time::timeout(Duration::from_secs(5), fetch)
            .await
            .ok()
            .flatten()
    }

    pub fn parse(text: &str) -> Scrape {
        let mut series = std::collections::BTreeMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            // `name{labels} value [timestamp]`; label values may hold spaces.
            let split = match line.rfind('}') {
                Some(i) => i + 1,
                None => line.find(' ').unwrap_or(line.len()),
            };
            let (name, rest) = line.split_at(split);
            if let Some(v) = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
            {
                series.insert(name.to_string(), v);
            }
        }
        Scrape(series)
    }

    /// The labels of a series as `(name, value)` pairs.
    fn labels(series: &str) -> Vec<(&str, &str)> {
        let Some(inner) = series
            .split_once('{')
            .and_then(|(_, r)| r.strip_suffix('}'))
        else {
            return Vec::new();
        };
        inner
            .split("\",")
            .filter_map(|kv| {
                let (k, v) = kv.split_once("=\"")?;
                Some((k.trim(), v.trim_end_matches('"')))
            })
            .collect()
    }

    fn name(series: &str) -> &str {
        series.split('{').next().unwrap_or(series)
    }

    /// The sum of the series of metric `name` whose labels include all of `with`.
    pub fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(s, _)| Self::name(s) == name)
            .filter(|(s, _)| {
                let labels = Self::labels(s);
                with.iter().all(|w| labels.contains(w))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// The series of `name` (with all of `with`) summed by the values of label `by`.
    pub fn by(
        &self,
        name: &str,
        by: &str,
        with: &[(&str, &str)],
    ) -> std::collections::BTreeMap<String, f64> {
        let mut out = std::collections::BTreeMap::new();
        for (s, v) in &self.0 {
            if Self::name(s) != name {
                continue;
            }
            let labels = Self::labels(s);
            if !with.iter().all(|w| labels.contains(w)) {
                continue;
            }
            let key = labels
                .iter()
                .find(|(k, _)| *k == by)
                .map(|(_, v)| v.to_string())
                .unwrap_or_default();
            *out.entry(key).or_insert(0.0) += v;
        }
        out
    }

    /// Every series' growth since `earlier` (series absent then count from 0).
    pub fn since(&self, earlier: &Scrape) -> Scrape {
        Scrape(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v - earlier.0.get(k).copied().unwrap_or(0.0)))
                .collect(),
        )
    }
}

/// cloudcore's apiserver requests in `delta` (a [`Scrape::since`]) as `verb resource count`,
/// most first, and their total.
pub fn apiserver_requests(delta: &Scrape) -> (f64, String) {
    let mut by: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for (series, n) in &delta.0 {
        if Scrape::name(series) != "cloudcore_apiserver_requests_total" || *n <= 0.0 {
            continue;
        }
        let labels = Scrape::labels(series);
        let get = |k: &str| {
            labels
                .iter()
                .find(|(name, _)| *name == k)
                .map_or("?", |(_, v)| *v)
        };
        *by.entry(format!("{} {}", get("verb"), get("resource")))
            .or_default() += n;
    }
    let total = by.values().sum();
    let mut list: Vec<(String, f64)> = by.into_iter().collect();
    list.sort_by(|a, b| b.1.total_cmp(&a.1));
    let text = list
        .iter()
        .map(|(k, n)| format!("{k} {n:.0}"))
        .collect::<Vec<_>>()
        .join(", ");
    (total, if text.is_empty() { "none".into() } else { text })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_sums_series_by_label() {
        let s = Scrape::parse(
            "# TYPE x counter\nx_total{verb=\"get\",resource=\"pods\",code=\"2xx\"} 3\n\
             x_total{verb=\"list\",resource=\"pods\",code=\"2xx\"} 2\n\
             x_total{verb=\"get\",resource=\"nodes\",code=\"4xx\"} 1\ng 7\n# EOF\n",
        );
        assert_eq!(s.sum("x_total", &[]), 6.0);
        assert_eq!(s.sum("x_total", &[("verb", "get")]), 4.0);
        assert_eq!(s.sum("g", &[]), 7.0);
        let by = s.by("x_total", "verb", &[("resource", "pods")]);
        assert_eq!(by.get("get"), Some(&3.0));
        assert_eq!(by.get("list"), Some(&2.0));
        let later = Scrape::parse("x_total{verb=\"get\",resource=\"pods\",code=\"2xx\"} 5\n");
        assert_eq!(later.since(&s).sum("x_total", &[]), 2.0);
        let api = Scrape::parse(
            "cloudcore_apiserver_requests_total{verb=\"list\",resource=\"pods\",code=\"2xx\"} 3\n\
             cloudcore_apiserver_requests_total{verb=\"list\",resource=\"pods\",code=\"5xx\"} 1\n\
             cloudcore_apiserver_requests_total{verb=\"get\",resource=\"configmaps\",code=\"2xx\"} 1\n",
        );
        assert_eq!(
            apiserver_requests(&api),
            (5.0, "list pods 4, get configmaps 1".to_string())
        );
    }
}

#[cfg(test)]
mod cli_tests {
    #[test]
    fn help_is_the_module_documentation() {
        let src = "//! Bench.\n//!\n//!     run it\nuse x;\n//! not this\n";
        assert_eq!(super::doc_of(src), "Bench.\n\n    run it");
    }
}
