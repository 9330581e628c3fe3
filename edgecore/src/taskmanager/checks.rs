//! The pre-checks a node task may ask for (`checkItems`): `cpu`, `mem`, `disk`, each refused
//! above 80 % use, with KubeEdge's messages. Read from `/proc` and `statvfs`; no commands.

use std::time::Duration;

/// KubeEdge's limit for every check item.
pub const MAX_USAGE: f64 = 80.0;

/// Runs `items` in order; the first failure's message.
pub async fn run(items: &[String]) -> Result<(), String> {
    for item in items {
        let (what, usage) = match item.as_str() {
            "cpu" => ("cpu", cpu_usage().await?),
            "mem" => ("mem", mem_usage()?),
            "disk" => ("disk", disk_usage("/")?),
            other => return Err(format!("check item {other} not support")),
        };
        judge(what, usage)?;
    }
    Ok(())
}

/// KubeEdge's wording: `current <item> usage is 91.20, which exceeds the maximum allowed usage 80.00`.
pub fn judge(what: &str, usage: f64) -> Result<(), String> {
    if usage > MAX_USAGE {
        return Err(format!(
            "current {what} usage is {usage:.2}, which exceeds the maximum allowed usage {MAX_USAGE:.2}"
        ));
    }
    Ok(())
}

/// Busy share of all CPUs over 100 ms, from `/proc/stat`.
async fn cpu_usage() -> Result<f64, String> {
    let a = cpu_times()?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = cpu_times()?;
    let (busy, total) = (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1));
    Ok(if total == 0 {
        0.0
    } else {
        busy as f64 * 100.0 / total as f64
    })
}

/// (busy, total) jiffies of the `cpu` line.
fn cpu_times() -> Result<(u64, u64), String> {
    let text =
        std::fs::read_to_string("/proc/stat").map_err(|e| format!("read /proc/stat: {e}"))?;
    parse_cpu_line(&text).ok_or_else(|| "no cpu line in /proc/stat".to_string())
}

pub fn parse_cpu_line(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest counted in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// Memory in use (total − available) over total, from `/proc/meminfo`.
fn mem_usage() -> Result<f64, String> {
    let text =
        std::fs::read_to_string("/proc/meminfo").map_err(|e| format!("read /proc/meminfo: {e}"))?;
    parse_meminfo(&text).ok_or_else(|| "no MemTotal/MemAvailable in /proc/meminfo".to_string())
}

pub fn parse_meminfo(text: &str) -> Option<f64> {
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
    (total > 0).then(|| total.saturating_sub(available) as f64 * 100.0 / total as f64)
}

/// Used over (used + available to unprivileged users), as `df` and KubeEdge compute it.
fn disk_usage(path: &str) -> Result<f64, String> {
    let u = kubeedge_edged::stats::host::fs_usage(std::path::Path::new(path))
        .ok_or_else(|| format!("statvfs {path} failed"))?;
    Ok(if u.used + u.available == 0 {
        0.0
    } else {
        u.used as f64 * 100.0 / (u.used + u.available) as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_and_judged_as_kubeedge_judges_it() {
        assert_eq!(
            parse_cpu_line("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n"),
            Some((200, 1000))
        );
        let mem = parse_meminfo("MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 250 kB\n");
        assert_eq!(mem, Some(75.0));
        assert!(judge("mem", 75.0).is_ok());
        assert_eq!(
            judge("disk", 91.2).unwrap_err(),
            "current disk usage is 91.20, which exceeds the maximum allowed usage 80.00"
        );
    }

    #[tokio::test]
    async fn unknown_items_are_refused_and_known_ones_read_this_machine() {
        assert_eq!(
            run(&["gpu".to_string()]).await.unwrap_err(),
            "check item gpu not support"
        );
        // Whatever this machine's load, the reads work (a refusal names the item).
        for item in ["cpu", "mem", "disk"] {
            if let Err(e) = run(&[item.to_string()]).await {
                assert!(e.starts_with(&format!("current {item} usage is")), "{e}");
            }
        }
    }
}
