//! What a row measures besides bind times: load, RSS, CPU seconds, the
//! scheduler's metrics, the --probe cycles, percentiles.

use super::*;

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `VmHWM` and `VmRSS` of a process, in MiB.
pub(crate) fn rss_mib(pid: u32) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let get = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
    };
    Some((get("VmHWM:")?, get("VmRSS:")?))
}

/// CPU seconds (user + system) a process has used.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// A plain HTTP GET on localhost (the metrics endpoint), no client crate.
pub(crate) async fn http_get(port: u16, path: &str) -> Option<String> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        Some(buf.split_once("\r\n\r\n")?.1.to_string())
    })
    .await
    .ok()?
}

pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The cycle histogram's (sum, count) now.
pub(crate) async fn cycle_totals(port: u16) -> Option<(f64, f64)> {
    let m = http_get(port, "/metrics").await?;
    Some((
        metric(&m, "gpusched_cycle_duration_seconds_sum"),
        metric(&m, "gpusched_cycle_duration_seconds_count"),
    ))
}

/// `--probe N`: one pod at a time on the drained cluster; per pod, the
/// first cycle(s) that end after it was created (the histogram's sum and
/// count before and after) and their mean duration. Returns the summary.
pub(crate) async fn probe_cycles(client: &Client, port: u16, n: usize, scheduler: &str) -> String {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut per_cycle_ms = Vec::new();
    let mut cycles = 0.0;
    for i in 0..n {
        let Some((s0, n0)) = cycle_totals(port).await else {
            return "probe: metrics unreadable".into();
        };
        let obj: Pod =
            serde_json::from_value(pod_json(&format!("probe-{i}"), None, None, scheduler)).unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
        // the first cycle that ends after the pod was created (the loop
        // also cycles periodically, so waiting for quiet may never end)
        let t0 = Instant::now();
        let (mut s1, mut n1) = (s0, n0);
        while t0.elapsed() < Duration::from_secs(30) && n1 == n0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Some((s, c)) = cycle_totals(port).await {
                (s1, n1) = (s, c);
            }
        }
        let dn = n1 - n0;
        if dn > 0.0 {
            cycles += dn;
            per_cycle_ms.push(1000.0 * (s1 - s0) / dn);
        }
    }
    per_cycle_ms.sort_by(|x, y| x.total_cmp(y));
    format!(
        "probe: {n} pods one at a time on the drained cluster were followed by {cycles:.0} cycles; mean cycle per pod p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct(&per_cycle_ms, 0.5),
        pct(&per_cycle_ms, 0.99),
        per_cycle_ms.last().copied().unwrap_or(f64::NAN)
    )
}

pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}
