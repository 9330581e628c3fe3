//! The demo's command line: `--help` prints help and starts nothing.

use std::process::Command;
use std::time::Duration;

#[test]
fn local_demo_help_prints_help_and_starts_nothing() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_local-demo"))
        .arg("--help")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("local-demo runs");
    // Help returns at once; the demo itself would run until stopped.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("waiting").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("local-demo --help did not exit: it started the demo");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Usage: local-demo"), "{text}");
    assert!(text.contains("edge-demo"), "{text}");
}

#[test]
fn demo_script_help_prints_usage_without_root_or_setup() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/demo.sh");
    let out = Command::new("bash")
        .args([script, "--help"])
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Usage: sudo bash scripts/demo.sh"), "{text}");
}

/// The demo's terminal shows the walk-through, the components' logs go to the files it names;
/// a second demo refuses to start while it runs; its output closed (`| head`) and then a
/// SIGHUP (its terminal gone): it still removes every process, mount, bridge and directory it
/// made.
#[test]
fn a_demo_with_closed_output_cleans_up_on_sighup() {
    use std::io::{BufRead, BufReader};
    if !e2e::process::is_root() {
        println!("SKIPPED a_demo_with_closed_output_cleans_up_on_sighup: needs root (containerd)");
        return;
    }
    let demo_dir = std::env::temp_dir().join("kubeedge-rs-demo");
    let stderr_file = tempfile::NamedTempFile::new().expect("a temp file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_local-demo"))
        .stdout(std::process::Stdio::piped())
        .stderr(stderr_file.reopen().expect("reopen"))
        .spawn()
        .expect("local-demo runs");
    let pid = child.id() as i32;
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let ready = line.starts_with("Ready.");
            if tx.send(line).is_err() || ready {
                // Returning drops the read end: the demo's stdout is now closed.
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let ready = line.starts_with("Ready.");
                seen.push(line);
                if ready {
                    break;
                }
            }
            Err(_) => {
                e2e::process::signal(pid, libc::SIGTERM);
                let _ = child.wait();
                panic!(
                    "the demo did not get ready within 240s:\n{}\nstderr:\n{}",
                    seen.join("\n"),
                    std::fs::read_to_string(stderr_file.path()).unwrap_or_default()
                );
            }
        }
    }
    let find = |prefix: &str| {
        seen.iter()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|r| r.trim().to_string()))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?}:\n{}", seen.join("\n")))
    };
    // The walk-through only: the components log to the files the first line names.
    let logs = find("Logs:");
    let logs_dir = std::path::PathBuf::from(logs.split("/{").next().unwrap_or_default());
    for line in &seen {
        assert!(
            !line.contains(" INFO ") && !line.contains(" WARN "),
            "a log line in the demo's terminal: {line}"
        );
    }
    for file in ["apiserver.log", "cloudcore.log", "edgecore.log"] {
        let text = std::fs::read_to_string(logs_dir.join(file))
            .unwrap_or_else(|e| panic!("{}: {e}", logs_dir.join(file).display()));
        assert!(text.contains("INFO"), "{file} holds no log lines");
    }
    // A second demo refuses at once, saying why; the first is untouched.
    let second = Command::new(env!("CARGO_BIN_EXE_local-demo"))
        .output()
        .expect("a second local-demo runs");
    assert!(!second.status.success(), "a second demo started");
    let why = String::from_utf8_lossy(&second.stderr);
    assert!(
        why.contains("another local demo is running") && why.contains(&format!("pid {pid}")),
        "{why}"
    );
    assert!(
        child.try_wait().expect("waiting").is_none(),
        "the first demo stopped"
    );
    let endpoint = find("CRI endpoint");
    let containerd_dir = endpoint
        .trim_start_matches("unix://")
        .trim_end_matches("/containerd.sock")
        .to_string();
    let bridge = find("pod network")
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string();
    // Give the reader time to close the pipe, then hang up.
    std::thread::sleep(Duration::from_millis(500));
    e2e::process::signal(pid, libc::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            e2e::process::signal(pid, libc::SIGKILL);
            panic!("the demo did not stop within 60s of SIGHUP");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "the demo exited with {status}");
    assert!(!demo_dir.exists(), "{} left behind", demo_dir.display());
    assert!(
        !std::path::Path::new(&containerd_dir).exists(),
        "{containerd_dir} left behind"
    );
    for needle in [containerd_dir.as_str(), "kubeedge-rs-demo"] {
        let left = e2e::process::pids_with_cmdline_containing(needle);
        assert!(
            left.is_empty(),
            "processes left behind ({needle}): {left:?}"
        );
    }
    assert!(
        e2e::process::mounts_under(std::path::Path::new(&containerd_dir)).is_empty(),
        "mounts left under {containerd_dir}"
    );
    let link = Command::new("ip")
        .args(["link", "show", &bridge])
        .output()
        .expect("ip runs");
    assert!(!link.status.success(), "bridge {bridge} left behind");
}
