//! What `edgecore join` installs beyond the configuration and certificate — the systemd unit
//! `edgecore.service`, enabled and started where systemd runs — and what `edgecore reset`
//! removes again: the unit (stopped and disabled), the certificates, the configuration and,
//! after confirmation, the edge database. Paths under `root` (`/` outside tests); commands run
//! through a [`Systemctl`] without a shell.

use crate::config::EdgeCoreConfig;
use std::path::{Path, PathBuf};

/// Where the unit goes, under the root.
pub const UNIT_PATH: &str = "etc/systemd/system/edgecore.service";
pub const UNIT_NAME: &str = "edgecore.service";

/// The unit for `binary` reading `config` (`manifests/edgecore.service` is this for
/// `/usr/local/bin/edgecore` and `/etc/kubeedge/config/edgecore.yaml`).
pub(crate) fn unit_text(binary: &Path, config: &Path) -> String {
    format!(
        "[Unit]\n\
         Description=kubeedge-rs edgecore: the edge node agent\n\
         Documentation=https://example.invalid/kubeedge-rs\n\
         After=network-online.target containerd.service\n\
         Wants=network-online.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={} --config {}\n\
         Restart=always\n\
         RestartSec=10\n\
         KillMode=process\n\
         LimitNOFILE=65536\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        binary.display(),
        config.display()
    )
}

/// Runs `systemctl` (a recorder in tests).
pub trait Systemctl {
    fn run(&self, args: &[&str]) -> Result<(), String>;
}

/// The real `systemctl`.
pub struct SystemSystemctl;

impl Systemctl for SystemSystemctl {
    fn run(&self, args: &[&str]) -> Result<(), String> {
        let out = std::process::Command::new("systemctl")
            .args(args)
            .output()
            .map_err(|e| format!("cannot run systemctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "systemctl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// Whether systemd manages this machine (`sd_booted`: `/run/systemd/system` exists).
pub(crate) fn systemd_runs(root: &Path) -> bool {
    root.join("run/systemd/system").is_dir()
}

/// What [`install_service`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Installed {
    /// The unit is written, enabled and started.
    Started(PathBuf),
    /// The unit is written; systemd does not run here, so nothing started it.
    WrittenOnly(PathBuf),
}

/// Writes the unit and, where systemd runs, enables and starts it.
pub fn install_service(
    root: &Path,
    binary: &Path,
    config: &Path,
    systemctl: &dyn Systemctl,
) -> Result<Installed, String> {
    let unit = root.join(UNIT_PATH);
    if let Some(dir) = unit.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(&unit, unit_text(binary, config))
        .map_err(|e| format!("cannot write {}: {e}", unit.display()))?;
    if !systemd_runs(root) {
        return Ok(Installed::WrittenOnly(unit));
    }
    systemctl.run(&["daemon-reload"])?;
    systemctl.run(&["enable", "--now", UNIT_NAME])?;
    Ok(Installed::Started(unit))
}

/// What `reset` removed, and what it kept.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ResetReport {
    pub removed: Vec<PathBuf>,
    pub kept: Vec<PathBuf>,
    pub stopped_service: bool,
}

/// Stops and disables the service, removes the unit, the files `config` names (certificates,
/// the DMI socket), the configuration file itself and — when `remove_database` — the database
/// with its WAL files. A missing file is not an error.
pub fn reset(
    root: &Path,
    config_path: &Path,
    config: Option<&EdgeCoreConfig>,
    remove_database: bool,
    systemctl: &dyn Systemctl,
) -> Result<ResetReport, String> {
    let mut report = ResetReport::default();
    let unit = root.join(UNIT_PATH);
    if unit.exists() && systemd_runs(root) {
        systemctl.run(&["disable", "--now", UNIT_NAME])?;
        report.stopped_service = true;
    }
    let mut files = vec![unit];
    if let Some(c) = config {
        let hub = &c.modules.edge_hub;
        let stream = &c.modules.edge_stream;
        for f in [
            &hub.tls_ca_file,
            &hub.tls_cert_file,
            &hub.tls_private_key_file,
            &stream.tls_tunnel_ca_file,
            &stream.tls_tunnel_cert_file,
            &stream.tls_tunnel_private_key_file,
        ] {
            if !f.is_empty() {
                files.push(PathBuf::from(f));
            }
        }
        files.push(crate::devicetwin::dmi::socket_path(
            &c.modules.device_twin.dmi_sock_path,
        ));
    }
    files.push(config_path.to_path_buf());
    let database: Vec<PathBuf> = config
        .map(|c| {
            let db = &c.database.data_source;
            vec![
                PathBuf::from(db),
                PathBuf::from(format!("{db}-wal")),
                PathBuf::from(format!("{db}-shm")),
            ]
        })
        .unwrap_or_default();
    if remove_database {
        files.extend(database);
    } else {
        report.kept = database.into_iter().filter(|p| p.exists()).collect();
    }
    files.sort();
    files.dedup();
    for f in files {
        match std::fs::remove_file(&f) {
            Ok(()) => report.removed.push(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", f.display())),
        }
    }
    if report.stopped_service {
        systemctl.run(&["daemon-reload"])?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Systemctl for Recorder {
        fn run(&self, args: &[&str]) -> Result<(), String> {
            self.0.lock().unwrap().push(args.join(" "));
            Ok(())
        }
    }

    #[test]
    fn the_manifest_unit_is_the_one_join_installs() {
        let manifest = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/edgecore.service"),
        )
        .unwrap();
        let without_comments: String = manifest
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            without_comments,
            unit_text(
                Path::new("/usr/local/bin/edgecore"),
                Path::new("/etc/kubeedge/config/edgecore.yaml")
            )
        );
    }

    #[test]
    fn join_installs_and_starts_the_unit_only_where_systemd_runs() {
        let root = tempfile::tempdir().unwrap();
        let sys = Recorder::default();
        let bin = Path::new("/opt/edge/edgecore");
        let cfg = Path::new("/etc/kubeedge/config/edgecore.yaml");
        let got = install_service(root.path(), bin, cfg, &sys).unwrap();
        assert_eq!(got, Installed::WrittenOnly(root.path().join(UNIT_PATH)));
        assert!(sys.0.lock().unwrap().is_empty());
        let text = std::fs::read_to_string(root.path().join(UNIT_PATH)).unwrap();
        assert!(
            text.contains(
                "ExecStart=/opt/edge/edgecore --config /etc/kubeedge/config/edgecore.yaml"
            )
        );

        std::fs::create_dir_all(root.path().join("run/systemd/system")).unwrap();
        let got = install_service(root.path(), bin, cfg, &sys).unwrap();
        assert_eq!(got, Installed::Started(root.path().join(UNIT_PATH)));
        assert_eq!(
            *sys.0.lock().unwrap(),
            ["daemon-reload", "enable --now edgecore.service"]
        );
    }

    #[test]
    fn reset_removes_what_join_wrote_and_the_database_only_when_asked() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("run/systemd/system")).unwrap();
        let etc = r.join("etc/kubeedge");
        std::fs::create_dir_all(etc.join("certs")).unwrap();
        std::fs::create_dir_all(etc.join("ca")).unwrap();
        let mut c = EdgeCoreConfig::default_config();
        c.modules.edge_hub.tls_ca_file = etc.join("ca/rootCA.crt").display().to_string();
        c.modules.edge_hub.tls_cert_file = etc.join("certs/server.crt").display().to_string();
        c.modules.edge_hub.tls_private_key_file =
            etc.join("certs/server.key").display().to_string();
        c.modules.edge_stream.tls_tunnel_ca_file = c.modules.edge_hub.tls_ca_file.clone();
        c.modules.edge_stream.tls_tunnel_cert_file = c.modules.edge_hub.tls_cert_file.clone();
        c.modules.edge_stream.tls_tunnel_private_key_file =
            c.modules.edge_hub.tls_private_key_file.clone();
        c.modules.device_twin.dmi_sock_path = etc.display().to_string();
        let db = r.join("var/lib/kubeedge/edgecore.db");
        std::fs::create_dir_all(db.parent().unwrap()).unwrap();
        c.database.data_source = db.display().to_string();
        let config_path = etc.join("config/edgecore.yaml");
        std::fs::create_dir_all(config_path.parent().unwrap()).unwrap();
        for f in [
            etc.join("ca/rootCA.crt"),
            etc.join("certs/server.crt"),
            etc.join("certs/server.key"),
            etc.join("dmi.sock"),
            config_path.clone(),
            db.clone(),
            PathBuf::from(format!("{}-wal", db.display())),
        ] {
            std::fs::write(&f, "x").unwrap();
        }
        let sys = Recorder::default();
        install_service(r, Path::new("/usr/local/bin/edgecore"), &config_path, &sys).unwrap();
        sys.0.lock().unwrap().clear();

        let report = reset(r, &config_path, Some(&c), false, &sys).unwrap();
        assert!(report.stopped_service);
        assert_eq!(
            *sys.0.lock().unwrap(),
            ["disable --now edgecore.service", "daemon-reload"]
        );
        for gone in [
            r.join(UNIT_PATH),
            etc.join("ca/rootCA.crt"),
            etc.join("certs/server.key"),
            etc.join("dmi.sock"),
            config_path.clone(),
        ] {
            assert!(!gone.exists(), "{} left", gone.display());
        }
        assert!(db.exists(), "the database stays without confirmation");
        assert!(report.kept.contains(&db));

        let report = reset(r, &config_path, Some(&c), true, &sys).unwrap();
        assert!(!db.exists());
        assert!(!report.stopped_service, "the unit is gone already");
        assert!(report.removed.contains(&db));
    }
}
