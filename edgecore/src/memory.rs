//! Process memory housekeeping.

/// Gives the memory a large transient job freed back to the system (glibc keeps freed heap
/// otherwise, and the process's RSS would stay at the job's peak).
pub(crate) fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How often a running edgecore gives freed heap back ([`release_freed_memory_every`]).
pub const TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Gives freed heap back every `every`, for good. Bursts no single module knows about — a
/// link coming back with queued reports, a resync, a flood of pod events — free their memory
/// into glibc's free lists, which the process's RSS keeps counting (the soak saw an edge's
/// anonymous memory rise in steps at each link freeze, with no live heap behind the steps).
/// A trim of a heap this small takes well under a millisecond.
pub async fn release_freed_memory_every(every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        release_freed_memory();
    }
}

/// Malloc arenas the process may use. glibc gives every thread that allocates concurrently an
/// arena of its own (up to eight per core); memory a burst frees in one arena cannot serve
/// another, so after a burst (thousands of objects arriving at once) the RSS stays at the
/// sum of every arena's peak. Two arenas: measured with 1,000 Services and 10,000 endpoints,
/// edgecore with edgemesh stayed 8 MB above an idle edge instead of 18 MB (BENCHMARKS.md).
pub(crate) const MALLOC_ARENAS: i32 = 2;

/// Limits glibc's malloc arenas (`MALLOC_ARENAS`); call before any thread starts. A
/// `MALLOC_ARENA_MAX` in the environment wins.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes an allocator tunable; called before other threads run.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
    }
}

/// How long after start-up edgecore gives back the code only start-up ran
/// ([`release_startup_code`]).
pub const STARTUP_CODE_SETTLE: std::time::Duration = std::time::Duration::from_secs(120);

/// Gives back the resident pages of edgecore's own code and read-only data, once, after
/// start-up; returns how many bytes of mappings were advised. The kernel maps code 64 KB
/// around each page fault (fault-around) and reads ahead, so after start-up nearly the whole
/// binary is resident (7.3 of its 7.6 MB of code, measured), much of it run once: the config,
/// certificate bootstrap, the database's opening, the first sync. Pages a running edgecore
/// uses come back on their next use (from the page cache; from disk if memory pressure evicted
/// them). Measured on an idle edge, release build: RSS 12.3 → 10.1 MB, still 10.1 MB 80 s
/// later (BENCHMARKS.md). Without `MADV_PAGEOUT` (Linux before 5.4) nothing happens.
pub fn release_startup_code() -> usize {
    #[cfg(target_os = "linux")]
    {
        let (Ok(exe), Ok(maps)) = (
            std::fs::read_link("/proc/self/exe"),
            std::fs::read_to_string("/proc/self/maps"),
        ) else {
            return 0;
        };
        let mut advised = 0;
        for (start, end) in own_read_only_mappings(&maps, &exe) {
            // SAFETY: [start, end) is a read-only, file-backed mapping of this process's own
            // executable (from /proc/self/maps); MADV_PAGEOUT only drops the pages'
            // residency, and the kernel reads them back from the file on their next use.
            let r = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT)
            };
            if r == 0 {
                advised += end - start;
            }
        }
        advised
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// The read-only mappings (code, constants) of `exe` in a `/proc/<pid>/maps` text.
fn own_read_only_mappings(maps: &str, exe: &std::path::Path) -> Vec<(usize, usize)> {
    let Some(exe) = exe.to_str() else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            // offset, device, inode, then the path (which may hold spaces).
            let (_, _, _) = (f.next()?, f.next()?, f.next()?);
            let path = f.collect::<Vec<_>>().join(" ");
            if path != exe || !matches!(perms, "r-xp" | "r--p") {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (b > a).then_some((a, b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn only_the_executables_read_only_mappings_are_chosen() {
        let maps = "\
5600aa000000-5600aa200000 r--p 00000000 fd:01 123 /usr/local/bin/edge core
5600aa200000-5600aa900000 r-xp 00200000 fd:01 123 /usr/local/bin/edge core
5600aa900000-5600aa940000 rw-p 00900000 fd:01 123 /usr/local/bin/edge core
5600ab000000-5600ab100000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000100000 r-xp 00000000 fd:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000300000 r-xp 00000000 fd:01 123 /usr/local/bin/edge core (deleted)
garbage line
zz-yy r-xp 0 0 0 /usr/local/bin/edge core
";
        assert_eq!(
            own_read_only_mappings(maps, Path::new("/usr/local/bin/edge core")),
            vec![
                (0x5600aa000000, 0x5600aa200000),
                (0x5600aa200000, 0x5600aa900000)
            ]
        );
        assert!(own_read_only_mappings(maps, Path::new("/other")).is_empty());
    }

    #[test]
    fn the_test_binarys_own_code_can_be_given_back() {
        // The pages given back are read again on their next use: the test goes on running.
        let advised = release_startup_code();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = release
            .trim()
            .split(['.', '-'])
            .map(|n| n.parse::<u32>().unwrap_or(0));
        let version = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        if version >= (5, 4) {
            assert!(advised > 0, "no mapping of the test binary was advised");
        } else {
            eprintln!("kernel {release:?} has no MADV_PAGEOUT; only checked that nothing breaks");
        }
    }
}
