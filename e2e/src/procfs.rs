//! What the benchmarks read from `/proc` about a process: memory and CPU time.

/// A `kB` field of `/proc/<pid>/status` (e.g. `VmRSS:`, `VmHWM:`); `None` when unreadable.
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Resident set size in KiB (0 when the process is gone).
pub fn rss_kb(pid: u32) -> u64 {
    status_kb(pid, "VmRSS:").unwrap_or(0)
}

/// utime + stime of a process, in clock ticks (100/s on Linux); 0 when the process is gone.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces): utime is the 14th, stime the 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    num(11) + num(12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let me = std::process::id();
        assert!(rss_kb(me) > 0);
        assert!(status_kb(me, "VmHWM:").unwrap_or(0) >= rss_kb(me));
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_ticks(me) > 0);
        assert_eq!(status_kb(u32::MAX, "VmRSS:"), None);
    }
}
