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
