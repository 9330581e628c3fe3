//! The machine's own usage, as cAdvisor reports the root container: CPU time from
//! `/proc/stat`, memory from `/proc/meminfo` (working set = usage − inactive file pages),
//! page faults from `/proc/vmstat`, and the filesystem of edged's root directory.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// Cumulative CPU time of all cores in nanoseconds, from the first line of `/proc/stat`
/// (user + nice + system + irq + softirq + steal; guest time is already in user).
pub fn parse_cpu_nanos(stat: &str, ticks_per_second: u64) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let busy = [0usize, 1, 2, 5, 6, 7]
        .iter()
        .map(|i| v.get(*i).copied().unwrap_or(0))
        .fold(0u64, u64::saturating_add);
    let hz = ticks_per_second.max(1);
    Some(((busy as u128) * 1_000_000_000 / hz as u128) as u64)
}

/// Boot time (`btime` of `/proc/stat`).
pub fn parse_boot_time(stat: &str) -> Option<SystemTime> {
    let secs: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// One `key value` pair of `/proc/meminfo` (bytes) or `/proc/vmstat` (counts).
fn field(text: &str, key: &str, scale: u64) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, rest) = l.split_once([':', ' '])?;
        if k.trim() != key {
            return None;
        }
        rest.split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
            .map(|v| v * scale)
    })
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostMemory {
    pub capacity: u64,
    pub usage: u64,
    pub working_set: u64,
    pub rss: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
}

pub fn parse_memory(meminfo: &str, vmstat: &str) -> Option<HostMemory> {
    let kib = |k| field(meminfo, k, 1024);
    let capacity = kib("MemTotal")?;
    let usage = capacity.saturating_sub(kib("MemFree")?);
    let inactive_file = kib("Inactive(file)").unwrap_or(0);
    Some(HostMemory {
        capacity,
        usage,
        working_set: usage.saturating_sub(inactive_file),
        rss: kib("AnonPages").unwrap_or(0),
        page_faults: field(vmstat, "pgfault", 1).unwrap_or(0),
        major_page_faults: field(vmstat, "pgmajfault", 1).unwrap_or(0),
    })
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// `statvfs` of `path` (or its nearest existing ancestor).
pub fn fs_usage(path: &Path) -> Option<FsUsage> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct; the path is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    let frsize = s.f_frsize as u64;
    Some(FsUsage {
        capacity: s.f_blocks as u64 * frsize,
        available: s.f_bavail as u64 * frsize,
        used: (s.f_blocks as u64).saturating_sub(s.f_bfree as u64) * frsize,
        inodes: s.f_files as u64,
        inodes_free: s.f_ffree as u64,
    })
}

/// Clock ticks per second of `/proc/stat`.
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// Node CPU time now (nanoseconds) and the moment it was read.
pub fn read_cpu() -> Option<(SystemTime, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    Some((
        SystemTime::now(),
        parse_cpu_nanos(&stat, ticks_per_second())?,
    ))
}

/// One value of `/proc/meminfo`, in bytes.
pub fn meminfo_bytes(key: &str) -> Option<u64> {
    field(&std::fs::read_to_string("/proc/meminfo").ok()?, key, 1024)
}

pub fn read_memory() -> Option<HostMemory> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    parse_memory(&meminfo, &vmstat)
}

pub fn boot_time() -> Option<SystemTime> {
    parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_counts_busy_ticks_only() {
        let stat = "cpu  100 20 30 5000 40 5 6 7 8 0\ncpu0 1 2 3 4 5 6 7 8 9 0\nbtime 1700000000\n";
        // user+nice+system+irq+softirq+steal = 100+20+30+5+6+7 = 168 ticks at 100 Hz.
        assert_eq!(parse_cpu_nanos(stat, 100), Some(1_680_000_000));
        assert_eq!(
            parse_boot_time(stat),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(parse_cpu_nanos("cpu  x y\n", 100), None);
        assert_eq!(parse_cpu_nanos("", 100), None);
    }

    #[test]
    fn memory_working_set_leaves_out_inactive_file_pages() {
        let meminfo = "MemTotal:        1000 kB\nMemFree:          200 kB\nInactive(file):   300 kB\nAnonPages:    100 kB\n";
        let m = parse_memory(meminfo, "pgfault 55\npgmajfault 3\n").unwrap();
        assert_eq!(m.capacity, 1_024_000);
        assert_eq!(m.usage, 800 * 1024);
        assert_eq!(m.working_set, 500 * 1024);
        assert_eq!(
            (m.rss, m.page_faults, m.major_page_faults),
            (100 * 1024, 55, 3)
        );
        assert_eq!(parse_memory("MemFree: 1 kB\n", ""), None);
    }

    #[test]
    fn the_real_machine_reports_nonzero_usage() {
        let (_, cpu) = read_cpu().expect("/proc/stat");
        assert!(cpu > 0);
        let m = read_memory().expect("/proc/meminfo");
        assert!(m.working_set > 0 && m.working_set <= m.capacity);
        let fs = fs_usage(Path::new("/")).expect("statvfs /");
        assert!(fs.capacity >= fs.used && fs.capacity > 0);
    }
}
