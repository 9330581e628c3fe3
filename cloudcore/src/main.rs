//! cloudcore: the cloud side of kubeedge-rs.

use clap::Parser;
use cloudcore::config::{CloudCoreConfig, DEFAULT_CONFIG_PATH};
use std::net::IpAddr;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

/// The cloud part of kubeedge-rs: serves edge nodes over cloudhub (WSS :10000) and syncs
/// them with the Kubernetes API. Reads KubeEdge's cloudcore.yaml.
#[derive(Parser)]
#[command(name = "cloudcore", version)]
struct Args {
    /// Config file in KubeEdge's CloudCore layout.
    #[arg(long, default_value = DEFAULT_CONFIG_PATH, global = true)]
    config: PathBuf,
    /// Print the full default configuration and exit.
    #[arg(long)]
    defaultconfig: bool,
    /// Print a minimal configuration and exit.
    #[arg(long)]
    minconfig: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Run only the iptables manager (KubeEdge's iptables-manager, for
    /// `modules.iptablesManager.mode: external`): keeps nat chain TUNNEL-PORT on this host,
    /// one DNAT per entry of ConfigMap kubeedge/tunnelport to `<replica IP>:<streamPort>`
    /// (`modules.cloudStream.streamPort` of --config). Needs hostNetwork, NET_ADMIN and the
    /// `iptables` binary.
    IptablesManager,
    /// Make the stream server's certificate and key (stream.crt, stream.key) from the
    /// cluster CA, as KubeEdge's `certgen.sh stream` does. A kube-apiserver run with
    /// --kubelet-certificate-authority checks the certificate of every kubelet it calls,
    /// and for edge nodes that is cloudcore's stream server: it must come from that CA and
    /// name the address the apiserver dials, the edge node's InternalIP (with the tunnel-port
    /// DNAT, not cloudcore's own). cloudcore serves it from
    /// modules.cloudStream.tlsStreamCertFile/tlsStreamPrivateKeyFile. Needs no --config.
    StreamCertificate(StreamCertificateArgs),
    /// Print the join token edges use (`edgecore join --token`), from Secret
    /// kubeedge/tokensecret, as `keadm gettoken` does. Uses --kube-config, else
    /// kubeAPIConfig.kubeConfig of --config when that file exists, else in-cluster or
    /// $KUBECONFIG.
    Gettoken {
        /// A kubeconfig file for the cluster.
        #[arg(long, value_name = "FILE")]
        kube_config: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
struct StreamCertificateArgs {
    /// The cluster CA certificate (kubeadm: /etc/kubernetes/pki/ca.crt).
    #[arg(long, value_name = "FILE")]
    ca_cert: PathBuf,
    /// The cluster CA key, PEM (kubeadm: /etc/kubernetes/pki/ca.key).
    #[arg(long, value_name = "FILE")]
    ca_key: PathBuf,
    /// An IP address the apiserver dials the stream server at: each edge node's InternalIP.
    /// Repeatable; at least one --ip or --dns.
    #[arg(long = "ip", value_name = "IP")]
    ips: Vec<IpAddr>,
    /// A DNS name for the certificate (for nodes whose preferred address is a hostname).
    /// Repeatable.
    #[arg(long = "dns", value_name = "NAME")]
    dns: Vec<String>,
    /// Validity in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36_500))]
    days: u32,
    /// Where to write stream.crt and stream.key (cloudcore.yaml's tlsStreamCertFile and
    /// tlsStreamPrivateKeyFile default to /etc/kubeedge/certs/stream.crt and .key).
    #[arg(long, value_name = "DIR", default_value = "/etc/kubeedge/certs")]
    out_dir: PathBuf,
}

/// `cloudcore gettoken`: prints the token, or why not (exit 1).
fn gettoken(
    config: &std::path::Path,
    kube_config: Option<&std::path::Path>,
) -> std::process::ExitCode {
    kubeedge_shared::tls::install_default_provider();
    let mut cfg = if config.exists() {
        match CloudCoreConfig::load(config) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cloudcore gettoken: {e}");
                return std::process::ExitCode::from(2);
            }
        }
    } else {
        CloudCoreConfig::default_config()
    };
    if let Some(k) = kube_config {
        cfg.kube_api_config.kube_config = k.display().to_string();
    }
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| {
            rt.block_on(async {
                let client = cloudcore::app::kube_client(&cfg).await?;
                cloudcore::join::read_token(client).await
            })
        });
    match result {
        Ok(token) => {
            println!("{token}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cloudcore gettoken: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `cloudcore stream-certificate`: what it wrote, or why not.
fn stream_certificate(a: &StreamCertificateArgs) -> anyhow::Result<String> {
    use cloudcore::cloudstream::{
        StreamCertRequest, issue_certificate, load_ca, write_certificate,
    };
    let ca = load_ca(&a.ca_cert, &a.ca_key)?;
    let req = StreamCertRequest {
        ips: &a.ips,
        dns: &a.dns,
        days: a.days,
    };
    let cert = issue_certificate(&ca, &req)?;
    let (cert_path, key_path) = write_certificate(&a.out_dir, &cert)?;
    let names: Vec<String> = a
        .ips
        .iter()
        .map(IpAddr::to_string)
        .chain(a.dns.iter().cloned())
        .collect();
    Ok(format!(
        "wrote {} (for {}, signed by {}, valid {} days) and {}",
        cert_path.display(),
        names.join(", "),
        a.ca_cert.display(),
        a.days,
        key_path.display()
    ))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.defaultconfig {
        print!("{}", CloudCoreConfig::default_config().to_yaml());
        return std::process::ExitCode::SUCCESS;
    }
    if args.minconfig {
        print!("{}", CloudCoreConfig::minimal_yaml());
        return std::process::ExitCode::SUCCESS;
    }
    if let Some(Command::StreamCertificate(a)) = &args.command {
        return match stream_certificate(a) {
            Ok(done) => {
                println!("{done}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cloudcore stream-certificate: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Gettoken { kube_config }) = &args.command {
        return gettoken(&args.config, kube_config.as_deref());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // kube's per-request trace layer reports every failed request at ERROR
                // without context (also those a shutdown aborts); the callers log failures.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
                }),
        )
        .init();
    kubeedge_shared::tls::install_default_provider();
    raise_fd_limit();
    let cfg = match CloudCoreConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cloudcore: {e}");
            eprintln!("(print a starting point with `cloudcore --defaultconfig`)");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cloudcore: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let shutdown = CancellationToken::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutting down");
            s.cancel();
        });
        match args.command {
            Some(Command::IptablesManager) => {
                cloudcore::app::run_iptables_manager(cfg, shutdown).await
            }
            // Answered before the config is loaded.
            Some(Command::StreamCertificate(_) | Command::Gettoken { .. }) => Ok(()),
            None => cloudcore::app::run(cfg, shutdown).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("cloudcore: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One socket per edge node: raise the open-file soft limit to the hard limit, as the Go
/// runtime does for KubeEdge's cloudcore.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed in.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let wanted = lim.rlim_max;
            lim.rlim_cur = wanted;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                tracing::debug!(limit = wanted, "raised the open-file limit");
            }
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_manager_is_a_subcommand_taking_the_same_config() {
        let a = Args::try_parse_from(["cloudcore", "iptables-manager", "--config", "/c.yaml"])
            .expect("parses");
        assert!(matches!(a.command, Some(Command::IptablesManager)));
        assert_eq!(a.config, PathBuf::from("/c.yaml"));
        let a = Args::try_parse_from(["cloudcore"]).expect("parses");
        assert!(a.command.is_none());
        assert_eq!(a.config, PathBuf::from(DEFAULT_CONFIG_PATH));
        let help = Args::try_parse_from(["cloudcore", "iptables-manager", "--help"])
            .err()
            .expect("--help exits");
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = help.to_string();
        assert!(
            text.contains("TUNNEL-PORT") && text.contains("--config"),
            "{text}"
        );
    }

    #[test]
    fn stream_certificate_writes_a_pair_from_the_ca_and_explains_failures() {
        use kubeedge_shared::pki::CertificateAuthority;
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate().unwrap();
        let (ca_cert, ca_key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        std::fs::write(&ca_cert, &ca.cert.cert_pem).unwrap();
        std::fs::write(&ca_key, &ca.cert.key_pem).unwrap();
        let out = dir.path().join("certs");
        let parse = |extra: &[&str]| {
            let mut argv = vec![
                "cloudcore".to_string(),
                "stream-certificate".into(),
                "--ca-cert".into(),
                ca_cert.display().to_string(),
                "--ca-key".into(),
                ca_key.display().to_string(),
                "--out-dir".into(),
                out.display().to_string(),
            ];
            argv.extend(extra.iter().map(|s| s.to_string()));
            match Args::try_parse_from(argv).map(|a| a.command) {
                Ok(Some(Command::StreamCertificate(a))) => Ok(a),
                Ok(_) => panic!("not stream-certificate"),
                Err(e) => Err(e),
            }
        };
        let a = parse(&[
            "--ip",
            "10.254.254.1",
            "--ip",
            "192.0.2.7",
            "--dns",
            "edge.example",
        ])
        .unwrap();
        assert_eq!(a.days, 365);
        let done = stream_certificate(&a).unwrap();
        assert!(
            done.contains("stream.crt") && done.contains("10.254.254.1, 192.0.2.7, edge.example"),
            "{done}"
        );
        let pem = std::fs::read_to_string(out.join("stream.crt")).unwrap();
        let chain = kubeedge_shared::tls::load_certs(&out.join("stream.crt")).unwrap();
        assert!(pem.contains("BEGIN CERTIFICATE") && chain.len() == 1);
        assert!(kubeedge_shared::tls::load_key(&out.join("stream.key")).is_ok());

        // Flags clap refuses, with its message.
        for bad in [
            &["--ip", "not-an-ip"][..],
            &["--ip", "10.0.0.1", "--days", "0"],
            &["--ip", "10.0.0.1", "--days", "x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        // Errors that name the cause, not panics.
        let e = stream_certificate(&parse(&[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no --ip or --dns"), "{e}");
        let mut a = parse(&["--ip", "10.0.0.1"]).unwrap();
        a.ca_key = dir.path().join("missing.key");
        let e = format!("{:#}", stream_certificate(&a).unwrap_err());
        assert!(e.contains("missing.key"), "{e}");

        let help = Args::try_parse_from(["cloudcore", "stream-certificate", "--help"])
            .err()
            .expect("--help exits");
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = help.to_string();
        for flag in [
            "--ca-cert",
            "--ca-key",
            "--ip",
            "--dns",
            "--days",
            "--out-dir",
        ] {
            assert!(text.contains(flag), "{flag} in {text}");
        }
        assert!(text.contains("kubelet-certificate-authority"), "{text}");
    }
}
