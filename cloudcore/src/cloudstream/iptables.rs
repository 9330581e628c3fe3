//! The iptables manager (KubeEdge's `cloud/pkg/cloudstream/iptables`, mode `internal`): on the
//! cloud host, nat chain `TUNNEL-PORT`, jumped from `OUTPUT` and `PREROUTING`, holds one
//! `-p tcp --dport <tunnel port> -j DNAT --to <cloudcore IP>:<streamPort>` per entry of the
//! tunnel port record (ConfigMap `kubeedge/tunnelport`), so that the apiserver's calls to
//! `<edge node IP>:<its kubelet port>` reach the stream server of the replica holding the
//! node's tunnel. Reconciled every period and whenever the ConfigMap changes; rules no longer
//! in the record (and anything else in the chain) are removed.
//!
//! The `iptables` binary runs with an argument vector, never through a shell. It needs the
//! host's network namespace (hostNetwork) and CAP_NET_ADMIN.

use super::tunnel_port::{self, TunnelPortRecord};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const CHAIN: &str = "TUNNEL-PORT";
const COMMENT: &str = "kubeedge tunnel port";
const JUMPS_FROM: [&str; 2] = ["OUTPUT", "PREROUTING"];

/// One DNAT rule of the chain: `--dport port` → `to` (`ip:streamPort`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DnatRule {
    pub port: u16,
    pub to: String,
}

impl DnatRule {
    fn args(&self) -> Vec<String> {
        [
            "-p",
            "tcp",
            "--dport",
            &self.port.to_string(),
            "-j",
            "DNAT",
            "--to",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([self.to.clone()])
        .collect()
    }
}

/// The rules the record asks for. IPv6 entries are skipped (they would need ip6tables).
pub fn desired_rules(record: &TunnelPortRecord, stream_port: u16) -> BTreeSet<DnatRule> {
    record
        .ip_tunnel_port
        .iter()
        .filter_map(|(ip, port)| match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(v4)) => Some(DnatRule {
                port: *port,
                to: format!("{v4}:{stream_port}"),
            }),
            _ => {
                tracing::warn!(%ip, port, "tunnel port record entry is not an IPv4 address; no rule for it");
                None
            }
        })
        .collect()
}

/// A rule listed by `iptables -S TUNNEL-PORT`: its arguments after `-A TUNNEL-PORT` (what
/// `-D TUNNEL-PORT` takes to delete it) and, if it is one of ours, what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRule {
    pub args: Vec<String>,
    pub dnat: Option<DnatRule>,
}

/// Parses `iptables -t nat -S TUNNEL-PORT` output (`-N TUNNEL-PORT`, then `-A TUNNEL-PORT …`).
pub fn parse_listing(out: &str) -> Vec<ListedRule> {
    out.lines()
        .filter_map(|line| {
            let words = split_words(line);
            if words.len() < 2 || words[0] != "-A" || words[1] != CHAIN {
                return None;
            }
            let args = words[2..].to_vec();
            let value = |flag: &str| {
                args.iter()
                    .position(|a| a == flag)
                    .and_then(|i| args.get(i + 1))
            };
            let is_dnat =
                value("-j").is_some_and(|j| j == "DNAT") && value("-p").is_some_and(|p| p == "tcp");
            let port = value("--dport").and_then(|p| p.parse().ok());
            let to = value("--to-destination").or_else(|| value("--to"));
            let dnat = match (is_dnat, port, to) {
                (true, Some(port), Some(to)) => Some(DnatRule {
                    port,
                    to: to.clone(),
                }),
                _ => None,
            };
            Some(ListedRule { args, dnat })
        })
        .collect()
}

/// Splits an `iptables -S` line into words; a double-quoted word (a comment) is one word.
fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut any) = (false, false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(cur);
    }
    words
}

/// What to change: the listed rules to delete (stale, foreign or duplicate) and the rules to add.
pub fn diff(
    listed: &[ListedRule],
    desired: &BTreeSet<DnatRule>,
) -> (Vec<Vec<String>>, Vec<DnatRule>) {
    let mut kept = BTreeSet::new();
    let mut delete = Vec::new();
    for r in listed {
        match &r.dnat {
            Some(d) if desired.contains(d) && kept.insert(d.clone()) => {}
            _ => delete.push(r.args.clone()),
        }
    }
    let add = desired.difference(&kept).cloned().collect();
    (delete, add)
}

#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    #[error(
        "iptables manager: the {0:?} binary was not found (install iptables in the image, as cloudcore/Dockerfile does, or set modules.iptablesManager.enable: false)"
    )]
    Missing(String),
    #[error(
        "iptables manager: `{cmd}` was refused ({stderr}); it needs hostNetwork and the NET_ADMIN capability (securityContext.capabilities.add: [NET_ADMIN, NET_RAW])"
    )]
    NoCapability { cmd: String, stderr: String },
    #[error("iptables manager: `{cmd}` failed: {stderr}")]
    Failed { cmd: String, stderr: String },
    #[error("iptables manager: running {0:?}: {1}")]
    Spawn(String, std::io::Error),
}

/// How to run iptables: `program prefix… <args>` (normally just `iptables`; tests use
/// `ip netns exec <ns> iptables`).
#[derive(Debug, Clone)]
pub struct Iptables {
    pub program: String,
    pub prefix: Vec<String>,
}

impl Default for Iptables {
    fn default() -> Self {
        Iptables {
            program: "iptables".into(),
            prefix: Vec::new(),
        }
    }
}

impl Iptables {
    /// Runs `iptables -w 5 -t nat <args>`; Ok(Err(stderr)) when it exits non-zero for
    /// another reason than a missing privilege.
    async fn nat(&self, args: &[String]) -> Result<Result<String, String>, IptablesError> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.prefix)
            .args(["-w", "5", "-t", "nat"])
            .args(args)
            .kill_on_drop(true);
        let out = match cmd.output().await {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(IptablesError::Missing(self.program.clone()));
            }
            Err(e) => return Err(IptablesError::Spawn(self.program.clone(), e)),
        };
        if out.status.success() {
            return Ok(Ok(String::from_utf8_lossy(&out.stdout).into_owned()));
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let lower = stderr.to_ascii_lowercase();
        if lower.contains("permission denied")
            || lower.contains("must be root")
            || lower.contains("operation not permitted")
        {
            return Err(IptablesError::NoCapability {
                cmd: self.show(args),
                stderr,
            });
        }
        if lower.contains("not found") && out.status.code() == Some(127) {
            return Err(IptablesError::Missing(self.program.clone()));
        }
        Ok(Err(stderr))
    }

    fn show(&self, args: &[String]) -> String {
        std::iter::once(self.program.as_str())
            .chain(self.prefix.iter().map(String::as_str))
            .chain(["-t", "nat"])
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }

    async fn must(&self, args: Vec<String>) -> Result<String, IptablesError> {
        self.nat(&args)
            .await?
            .map_err(|stderr| IptablesError::Failed {
                cmd: self.show(&args),
                stderr,
            })
    }

    /// Brings the chain to exactly `desired` (plus the jumps to it). Returns how many rules
    /// were added and deleted.
    pub async fn sync(
        &self,
        desired: &BTreeSet<DnatRule>,
    ) -> Result<(usize, usize), IptablesError> {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let listing = match self.nat(&owned(&["-S", CHAIN])).await? {
            Ok(out) => out,
            Err(_) => {
                self.must(owned(&["-N", CHAIN])).await?;
                String::new()
            }
        };
        for from in JUMPS_FROM {
            let jump = owned(&["-m", "comment", "--comment", COMMENT, "-j", CHAIN]);
            let check = [vec!["-C".to_string(), from.to_string()], jump.clone()].concat();
            if self.nat(&check).await?.is_err() {
                self.must([vec!["-A".to_string(), from.to_string()], jump].concat())
                    .await?;
            }
        }
        let (delete, add) = diff(&parse_listing(&listing), desired);
        for args in &delete {
            self.must([owned(&["-D", CHAIN]), args.clone()].concat())
                .await?;
        }
        for rule in &add {
            self.must([owned(&["-A", CHAIN]), rule.args()].concat())
                .await?;
        }
        Ok((add.len(), delete.len()))
    }
}

/// Runs the manager until `shutdown`: watches ConfigMap `kubeedge/tunnelport` and syncs the
/// chain on every change and every `period`. A missing binary or privilege is logged as an
/// error on every attempt (it does not stop cloudcore).
pub async fn run(
    client: kube::Client,
    iptables: Iptables,
    stream_port: u16,
    period: Duration,
    shutdown: CancellationToken,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, tunnel_port::NAMESPACE);
    let cfg =
        watcher::Config::default().fields(&format!("metadata.name={}", tunnel_port::CONFIGMAP));
    let mut events = watcher::watcher(api, cfg).boxed();
    let mut record: Option<TunnelPortRecord> = None;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            ev = events.next() => match ev {
                None => return,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "tunnelport ConfigMap watch failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Some(Ok(Event::Apply(cm) | Event::InitApply(cm))) => match TunnelPortRecord::of(&cm) {
                    Ok(r) => record = Some(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "tunnel port record unreadable; rules left as they are");
                        continue;
                    }
                },
                Some(Ok(Event::Delete(_))) => record = Some(TunnelPortRecord::default()),
                Some(Ok(Event::Init | Event::InitDone)) => continue,
            },
        }
        let Some(r) = &record else { continue };
        match iptables.sync(&desired_rules(r, stream_port)).await {
            Ok((0, 0)) => last_error = None,
            Ok((added, deleted)) => {
                last_error = None;
                tracing::info!(added, deleted, "tunnel port iptables rules updated");
            }
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_deref() != Some(&msg) {
                    tracing::error!("{msg}");
                } else {
                    tracing::debug!("{msg}");
                }
                last_error = Some(msg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(port: u16, to: &str) -> DnatRule {
        DnatRule {
            port,
            to: to.into(),
        }
    }

    #[test]
    fn the_record_becomes_one_dnat_per_replica() {
        let r = TunnelPortRecord::parse(
            r#"{"ipTunnelPort":{"10.0.0.5":10351,"10.0.0.6":10352,"fd00::1":10353},"port":{"10351":true,"10352":true,"10353":true}}"#,
        )
        .unwrap();
        let want: BTreeSet<_> =
            [rule(10351, "10.0.0.5:10003"), rule(10352, "10.0.0.6:10003")].into();
        assert_eq!(desired_rules(&r, 10003), want);
        assert_eq!(
            rule(10351, "10.0.0.5:10003").args().join(" "),
            "-p tcp --dport 10351 -j DNAT --to 10.0.0.5:10003"
        );
    }

    #[test]
    fn the_listing_is_parsed_as_iptables_prints_it() {
        let out = "-N TUNNEL-PORT\n\
                   -A TUNNEL-PORT -p tcp -m tcp --dport 10351 -j DNAT --to-destination 10.0.0.5:10003\n\
                   -A TUNNEL-PORT -s 1.2.3.4/32 -m comment --comment \"someone else\" -j ACCEPT\n";
        let l = parse_listing(out);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].dnat, Some(rule(10351, "10.0.0.5:10003")));
        assert_eq!(l[0].args[..4], ["-p", "tcp", "-m", "tcp"]);
        assert_eq!(l[1].dnat, None);
        assert!(
            l[1].args.contains(&"someone else".to_string()),
            "{:?}",
            l[1].args
        );
    }

    #[test]
    fn the_diff_removes_stale_foreign_and_duplicate_rules_and_adds_missing_ones() {
        let listed = parse_listing(
            "-A TUNNEL-PORT -p tcp -m tcp --dport 10351 -j DNAT --to-destination 10.0.0.5:10003\n\
             -A TUNNEL-PORT -p tcp -m tcp --dport 10351 -j DNAT --to-destination 10.0.0.5:10003\n\
             -A TUNNEL-PORT -p tcp -m tcp --dport 10352 -j DNAT --to-destination 10.0.0.9:10003\n\
             -A TUNNEL-PORT -j ACCEPT\n",
        );
        let desired: BTreeSet<_> =
            [rule(10351, "10.0.0.5:10003"), rule(10353, "10.0.0.7:10003")].into();
        let (delete, add) = diff(&listed, &desired);
        assert_eq!(delete.len(), 3, "{delete:?}");
        assert!(
            delete
                .iter()
                .any(|a| a.contains(&"10.0.0.9:10003".to_string()))
        );
        assert!(delete.iter().any(|a| a == &["-j", "ACCEPT"]));
        assert_eq!(add, vec![rule(10353, "10.0.0.7:10003")]);
        // In sync: nothing to do.
        let listed = parse_listing(
            "-A TUNNEL-PORT -p tcp -m tcp --dport 10351 -j DNAT --to-destination 10.0.0.5:10003\n",
        );
        let desired: BTreeSet<_> = [rule(10351, "10.0.0.5:10003")].into();
        assert_eq!(diff(&listed, &desired), (vec![], vec![]));
    }

    #[tokio::test]
    async fn a_missing_binary_is_named_in_the_error() {
        let ipt = Iptables {
            program: "/nonexistent/iptables-kers".into(),
            prefix: vec![],
        };
        let e = ipt.sync(&BTreeSet::new()).await.unwrap_err();
        assert!(matches!(e, IptablesError::Missing(_)), "{e}");
        assert!(e.to_string().contains("/nonexistent/iptables-kers"), "{e}");
    }
}
