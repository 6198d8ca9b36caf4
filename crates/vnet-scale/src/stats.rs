//! Resource figures of a process from `/proc/PID` (CPU seconds, resident memory) and etcd's
//! own counters from its `/metrics` page; and percentiles.

use std::time::Duration;

/// CPU seconds (user + system) and resident bytes of a process.
pub fn proc_usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name; rss is the 24th.
    let ticks = 100.0; // USER_HZ on Linux
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let rss_pages: u64 = f.get(21)?.parse().ok()?;
    Some(((utime + stime) / ticks, rss_pages * 4096))
}

/// The number of threads of a process.
pub fn threads(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The sum of a counter (all label sets) on a Prometheus text page.
pub fn metric_sum(page: &str, name: &str) -> f64 {
    metric_sum_with(page, name, "")
}

/// The sum of a counter over the label sets that contain `label` (`key="value"`).
pub fn metric_sum_with(page: &str, name: &str, label: &str) -> f64 {
    page.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// etcd's `/metrics` page, or an empty one when it cannot be read.
pub fn etcd_metrics(endpoint: &str) -> String {
    let url = if endpoint.starts_with("http") {
        format!("{endpoint}/metrics")
    } else {
        format!("http://{endpoint}/metrics")
    };
    ureq::get(&url)
        .timeout(Duration::from_secs(5))
        .call()
        .ok()
        .and_then(|r| r.into_string().ok())
        .unwrap_or_default()
}

/// p-th percentile (0..=100) of sorted seconds, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[2.0], 99.0), Some(2.0));
    }

    #[test]
    fn metric_lines() {
        let page = "# HELP x\nfoo_total{a=\"1\"} 2\nfoo_total{a=\"2\"} 3.5\nfoo_total_other 9\nfoo_total 1\n";
        assert_eq!(metric_sum(page, "foo_total"), 6.5);
        assert_eq!(metric_sum(page, "bar"), 0.0);
        assert_eq!(metric_sum_with(page, "foo_total", "a=\"2\""), 3.5);
    }

    #[test]
    fn own_process() {
        let (cpu, rss) = proc_usage(std::process::id()).unwrap();
        assert!(cpu >= 0.0 && rss > 0);
        assert!(threads(std::process::id()).unwrap() >= 1);
    }
}
