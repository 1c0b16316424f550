//! What a row measures besides bind times: load, RSS, CPU seconds, the
//! scheduler's metrics, the --probe pods' bind times (and gpusched's cycles), percentiles.

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

/// The label and `NoSchedule` taint of the `--probe` nodes: only the probe
/// pods (which tolerate the taint and select the label) may go there, so a
/// backlog left pending on a full cluster cannot take their room.
pub(crate) const PROBE_KEY: &str = "gpusched.io/probe";
/// How long one probe pod may take to be bound before it counts as a miss.
const PROBE_WAIT: Duration = Duration::from_secs(30);
/// The quiet before each probe pod, so each lands on an idle scheduler.
const PROBE_PAUSE: Duration = Duration::from_millis(200);

/// The probe pods' own nodes when the workload leaves fewer than `probe` GPUs
/// free (`pods` 1-GPU pods on `nodes` 8-GPU nodes: backlog mode's full
/// cluster): one node of the bench's shape per 8 probe pods, labelled and
/// tainted [`PROBE_KEY`]`=true`, created before the contender starts (no
/// node event in the probe itself) and left out of the nodes `rr` binds to.
/// Returns their names (none when the probe pods fit on the bench's nodes).
pub(crate) async fn make_probe_nodes(
    client: &Client,
    probe: usize,
    nodes: usize,
    pods: usize,
) -> Vec<String> {
    if probe == 0 || (nodes * 8).saturating_sub(pods) >= probe {
        return Vec::new();
    }
    let extra = format!(
        "    labels: {{{PROBE_KEY}: \"true\"}}\n    taints: [{{key: {PROBE_KEY}, value: \"true\", effect: NoSchedule}}]\n"
    );
    let (names, _, ready) = make_node_group(client, "probe-node", probe.div_ceil(8), &extra).await;
    eprintln!(
        "{} probe node(s) ({PROBE_KEY}=true:NoSchedule) Ready after {ready:.1}s",
        names.len()
    );
    names
}

/// `--probe N`, after the drain, for every contender: N 1-GPU pods created
/// one at a time (a [`PROBE_PAUSE`] before each); per pod, the time from the
/// create call's start to the moment the row's pod watch (`seen`) saw it
/// bound, waiting up to [`PROBE_WAIT`] (a pod not bound by then is a miss and
/// is counted as one). `dedicated`: the cluster is full and the pods go to
/// the probe nodes (toleration and nodeSelector for [`PROBE_KEY`]). With
/// gpusched's metrics port also the mean duration of the first cycle(s) that
/// end after each create (its cycle histogram's sum and count before and
/// after). Returns the summary.
pub(crate) async fn probe(
    client: &Client,
    seen: &Seen,
    metrics_port: Option<u16>,
    n: usize,
    scheduler: &str,
    probe_nodes: usize,
) -> String {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut e2e_ms = Vec::new();
    let mut missed = 0;
    let mut per_cycle_ms = Vec::new();
    let mut cycles = 0.0;
    for i in 0..n {
        tokio::time::sleep(PROBE_PAUSE).await;
        let name = format!("probe-{i}");
        let mut v = pod_json(&name, None, None, scheduler);
        if probe_nodes > 0 {
            v["spec"]["nodeSelector"] = json!({PROBE_KEY: "true"});
            v["spec"]["tolerations"] = json!([{
                "key": PROBE_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
        }
        let obj: Pod = serde_json::from_value(v).unwrap();
        let before = match metrics_port {
            Some(port) => cycle_totals(port).await,
            None => None,
        };
        let t0 = Instant::now();
        if let Err(e) = api.create(&PostParams::default(), &obj).await {
            eprintln!("probe create {name}: {e} (counted as not bound)");
            missed += 1;
            continue;
        }
        // until the watch saw it bound and (gpusched) a cycle ended after
        // the create (the loop also cycles periodically, so waiting for
        // quiet may never end)
        let mut after = before;
        let bound = loop {
            let b = seen.bound.lock().unwrap().get(&name).copied();
            let cycled = match (metrics_port, before, after) {
                (Some(_), Some((_, n0)), Some((_, n1))) => n1 != n0,
                _ => true,
            };
            if (b.is_some() && cycled) || t0.elapsed() >= PROBE_WAIT {
                break b;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            if !cycled
                && let Some(port) = metrics_port
                && let Some(t) = cycle_totals(port).await
            {
                after = Some(t);
            }
        };
        match bound.map(|b| b.saturating_duration_since(t0)) {
            Some(d) if d <= PROBE_WAIT => e2e_ms.push(d.as_secs_f64() * 1000.0),
            _ => missed += 1,
        }
        if let (Some((s0, n0)), Some((s1, n1))) = (before, after)
            && n1 > n0
        {
            cycles += n1 - n0;
            per_cycle_ms.push(1000.0 * (s1 - s0) / (n1 - n0));
        }
    }
    e2e_ms.sort_by(|x, y| x.total_cmp(y));
    let mut out = format!(
        "probe: {n} pods one at a time on the {} cluster: create → bound p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({missed} not bound in {} s){}",
        if probe_nodes > 0 { "full" } else { "drained" },
        pct(&e2e_ms, 0.5),
        pct(&e2e_ms, 0.99),
        e2e_ms.last().copied().unwrap_or(f64::NAN),
        PROBE_WAIT.as_secs(),
        if probe_nodes > 0 {
            format!(", on {probe_nodes} tainted probe node(s)")
        } else {
            String::new()
        },
    );
    if metrics_port.is_some() {
        per_cycle_ms.sort_by(|x, y| x.total_cmp(y));
        out = format!(
            "{out}; the probe pods were followed by {cycles:.0} cycles; mean cycle per pod p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            pct(&per_cycle_ms, 0.5),
            pct(&per_cycle_ms, 0.99),
            per_cycle_ms.last().copied().unwrap_or(f64::NAN)
        );
    }
    out
}

pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}
