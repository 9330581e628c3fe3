//! The `edgecore` binary: config printing, config errors, TLS errors, clean exit on SIGTERM.

use edgecore::config::EdgeCoreConfig;
use kubeedge_shared::pki::CertificateAuthority;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn edgecore() -> Command {
    Command::new(env!("CARGO_BIN_EXE_edgecore"))
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = edgecore().args(args).output().expect("edgecore runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn defaultconfig_output_loads_back_and_validates() {
    let (code, yaml, _) = run(&["--defaultconfig"]);
    assert_eq!(code, 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edgecore.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let loaded = EdgeCoreConfig::load(&path).unwrap();
    assert_eq!(loaded, EdgeCoreConfig::default_config());
}

#[test]
fn minconfig_output_loads_back() {
    let (code, yaml, _) = run(&["--minconfig"]);
    assert_eq!(code, 0);
    assert!(yaml.contains("kind: EdgeCore"), "{yaml}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edgecore.yaml");
    std::fs::write(&path, &yaml).unwrap();
    assert_eq!(
        EdgeCoreConfig::load(&path).unwrap(),
        EdgeCoreConfig::minimal_config()
    );
}

#[test]
fn config_errors_name_the_field_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edgecore.yaml");
    std::fs::write(
        &path,
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\nmodules:\n  edgeHub:\n    heartbeat: 0\n",
    )
    .unwrap();
    let (code, _, err) = run(&["--config", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("modules.edgeHub.heartbeat: must be > 0"),
        "{err}"
    );
    std::fs::write(
        &path,
        "modules:\n  metaManager:\n    remoteQueryTimeout: [1]\n",
    )
    .unwrap();
    let (code, _, err) = run(&["--config", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("modules.metaManager.remoteQueryTimeout"),
        "{err}"
    );
}

/// A valid config for a node whose cloud is at `server`, files under `dir`.
fn write_config(dir: &Path, server: &str, with_certs: bool) -> std::path::PathBuf {
    let mut c = EdgeCoreConfig::default_config();
    let hub = &mut c.modules.edge_hub;
    hub.websocket.server = server.to_string();
    hub.tls_ca_file = dir.join("ca.crt").display().to_string();
    hub.tls_cert_file = dir.join("edge.crt").display().to_string();
    hub.tls_private_key_file = dir.join("edge.key").display().to_string();
    c.modules.edged.hostname_override = "edge-cli".into();
    c.database.data_source = dir.join("db/edgecore.db").display().to_string();
    if with_certs {
        let ca = CertificateAuthority::generate().unwrap();
        let edge = ca
            .issue_client("system:node:edge-cli", Some("system:nodes"), 1)
            .unwrap();
        std::fs::write(dir.join("ca.crt"), &ca.cert.cert_pem).unwrap();
        std::fs::write(dir.join("edge.crt"), &edge.cert_pem).unwrap();
        std::fs::write(dir.join("edge.key"), &edge.key_pem).unwrap();
    }
    let path = dir.join("edgecore.yaml");
    std::fs::write(&path, c.to_yaml().unwrap()).unwrap();
    path
}

#[test]
fn missing_certificates_say_which_file_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "127.0.0.1:1", false);
    let (code, _, err) = run(&["--config", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("edge.crt"), "{err}");
    assert!(err.contains("modules.edgeHub.token is empty"), "{err}");
    assert!(err.contains("keadm gettoken"), "{err}");
    assert!(err.contains("edgecore join"), "{err}");
    assert!(err.contains("modules.edgeHub.tlsCaFile"), "{err}");
}

#[test]
fn sigterm_stops_edgecore_cleanly_and_leaves_a_database() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens there: edgecore keeps redialling until told to stop.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap().to_string();
    drop(listener);
    let path = write_config(dir.path(), &server, true);
    let mut child = edgecore()
        .args(["--config", path.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let db = dir.path().join("db/edgecore.db");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !db.exists() {
        assert!(Instant::now() < deadline, "database never created");
        assert!(child.try_wait().unwrap().is_none(), "edgecore exited early");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "edgecore ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut logs = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut logs);
    }
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("shutting down"), "{logs}");
    assert!(logs.contains("edgecore starting"), "{logs}");
}
