//! Child processes that must not outlive the test process, and cleaning up after them.
//!
//! [`spawn_tied`] starts a child in a process group of its own with `PR_SET_PDEATHSIG =
//! SIGKILL`, so the kernel kills it when the test process dies for any reason (an abort,
//! SIGKILL, Ctrl-C), while Ctrl-C itself reaches only the test process.
//! The death signal fires when the *thread* that forked the child exits, not the process; test
//! threads end as soon as their test does, so every child is forked by one dedicated spawner
//! thread that lives as long as the process.

use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Starts `command` from the long-lived spawner thread with a parent-death signal of SIGKILL.
pub fn spawn_tied(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("e2e-child-spawner".into())
            .spawn(move || {
                // Never returns: the static sender is never dropped.
                for (mut command, reply) in incoming {
                    let _ = reply.send(spawn_with_death_signal(&mut command));
                }
            })
            .expect("spawning the e2e child-spawner thread");
        requests
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .send((command, reply))
        .map_err(|_| io::Error::other("the e2e child-spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the e2e child-spawner thread is gone"))?
}

fn spawn_with_death_signal(command: &mut Command) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid, setpgid)
    // are made.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                return Err(io::Error::other("parent exited during spawn"));
            }
            // A process group of its own: Ctrl-C in a terminal signals the foreground group,
            // and the harness, not the terminal, decides when its children stop (after the
            // pods are removed through them).
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Sends SIGTERM, waits up to `grace` for the child to exit, then SIGKILLs it and reaps it.
pub fn terminate(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    signal(child.id() as i32, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends `sig` to `pid`; errors (the process is already gone) are ignored.
pub fn signal(pid: i32, sig: i32) {
    if pid > 0 {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Pids of the processes whose command line contains `needle` (this process excluded).
pub fn pids_with_cmdline_containing(needle: &str) -> Vec<i32> {
    let own = std::process::id() as i32;
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == own {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline: Vec<u8> = cmdline
            .into_iter()
            .map(|b| if b == 0 { b' ' } else { b })
            .collect();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Pids whose parent is `parent`.
pub fn children_of(parent: i32) -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may contain spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(parent) {
            pids.push(pid);
        }
    }
    pids
}

/// SIGKILLs every process whose command line contains `needle`, and their direct children
/// first (a containerd shim's children are the containers' init processes; killing a pid
/// namespace's init kills the whole namespace). Returns how many processes were signalled.
pub fn kill_process_trees_mentioning(needle: &str) -> usize {
    let mut killed = 0;
    for pid in pids_with_cmdline_containing(needle) {
        for child in children_of(pid) {
            signal(child, libc::SIGKILL);
            killed += 1;
        }
        signal(pid, libc::SIGKILL);
        killed += 1;
    }
    killed
}

/// Mount points at or below `dir` in this mount namespace, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut mounts: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    mounts.dedup();
    mounts
}

/// `/proc/self/mountinfo` escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let code = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(code as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lazily unmounts everything mounted at or below `dir`, deepest first, repeating while
/// that makes progress (stacked mounts). Returns the mount points that stayed mounted.
pub fn unmount_all_under(dir: &Path) -> Vec<PathBuf> {
    let mut previous = usize::MAX;
    loop {
        let mounts = mounts_under(dir);
        if mounts.is_empty() || mounts.len() >= previous {
            return mounts;
        }
        previous = mounts.len();
        for mount in &mounts {
            let Ok(c_path) = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: c_path is a valid NUL-terminated string for the duration of the call.
            unsafe {
                libc::umount2(c_path.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

/// Opens (creating) `path` and takes an exclusive `flock` without waiting. `Ok(None)` when
/// another process holds it. The lock lasts as long as the returned file is open, and the
/// kernel releases it when the holder dies, which is what makes it a liveness marker.
pub fn try_lock_file(path: &Path) -> io::Result<Option<File>> {
    use std::os::fd::AsRawFd;
    let file = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)?;
    // SAFETY: flock on a file descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Some(file));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(err)
    }
}

/// Whether this process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A process the harness started (control plane, cloudcore, edgecore…) with its stdout and
/// stderr in a log file. Dropping it stops the process; when the drop happens while a test is
/// failing (panicking), the tail of the log is printed so the failure shows what the process
/// said.
pub struct LoggedProcess {
    name: String,
    child: Child,
    log: PathBuf,
}

impl LoggedProcess {
    /// Starts `command` tied to this process, output appended to `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, mut command: Command, log_dir: &Path) -> io::Result<LoggedProcess> {
        std::fs::create_dir_all(log_dir)?;
        let log = log_dir.join(format!("{name}.log"));
        let out = File::options().create(true).append(true).open(&log)?;
        let err = out.try_clone()?;
        command
            .stdout(out)
            .stderr(err)
            .stdin(std::process::Stdio::null());
        let child = spawn_tied(command)?;
        Ok(LoggedProcess {
            name: name.to_string(),
            child,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last `lines` lines of the log, headed with the process name and log path.
    pub fn failure_report(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let tail = &all[all.len().saturating_sub(lines)..];
        format!(
            "----- last {} lines of {} ({}) -----\n{}\n-----",
            tail.len(),
            self.name,
            self.log.display(),
            tail.join("\n")
        )
    }
}

impl Drop for LoggedProcess {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(5));
        if std::thread::panicking() {
            eprintln!("{}", self.failure_report(60));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_process_captures_output_and_is_stopped_on_drop() {
        let dir = std::env::temp_dir().join(format!("logged-process-{}", std::process::id()));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started-ok; echo oops >&2; exec sleep 30"]);
        let mut p = LoggedProcess::spawn("sleeper", cmd, &dir).unwrap();
        let pid = p.pid();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !p.failure_report(10).contains("oops") {
            assert!(Instant::now() < deadline, "output reaches the log");
            std::thread::sleep(Duration::from_millis(20));
        }
        let report = p.failure_report(10);
        assert!(
            report.contains("started-ok") && report.contains("sleeper"),
            "{report}"
        );
        assert!(p.is_running());
        drop(p);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process stopped on drop"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mount_path(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(
            unescape_mount_path(r"/tmp/back\134slash"),
            r"/tmp/back\slash"
        );
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path(r"/trailing\04"), r"/trailing\04");
    }

    #[test]
    fn tied_child_runs_and_terminates() {
        let mut command = Command::new("sleep");
        command.arg("30");
        let mut child = spawn_tied(command).unwrap();
        assert!(child.try_wait().unwrap().is_none());
        let started = Instant::now();
        terminate(&mut child, Duration::from_secs(5));
        assert!(child.try_wait().unwrap().is_some());
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_held_lock_is_not_granted_twice() {
        let path = std::env::temp_dir().join(format!("e2e-lock-test-{}", std::process::id()));
        let held = try_lock_file(&path).unwrap().expect("first lock");
        // flock locks belong to the open file description: a second open conflicts.
        assert!(try_lock_file(&path).unwrap().is_none());
        drop(held);
        assert!(try_lock_file(&path).unwrap().is_some());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn children_are_found_by_parent_pid() {
        let mut command = Command::new("sleep");
        command.arg("30");
        let mut child = spawn_tied(command).unwrap();
        let own = std::process::id() as i32;
        assert!(children_of(own).contains(&(child.id() as i32)));
        terminate(&mut child, Duration::from_secs(1));
    }
}
