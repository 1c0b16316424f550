//! Agent benchmarks: steady RSS of the agent process with 8 fake GPUs,
//! Allocate and GetPreferredAllocation latency over the real unix-socket
//! gRPC path, health change → ListAndWatch update latency, and the pure
//! preferred-allocation time for 8 and 72 GPUs.
//!
//! `cargo bench -p gpusched-node-agent --bench agent` (prints a Markdown
//! report; `BENCH_QUICK=1` runs fewer iterations).

#[path = "../tests/common/mod.rs"]
mod common;

use common::{FakeKubelet, fixture, next_list};
use gpusched_node_agent::api;
use gpusched_node_agent::backend::fake::FakeBackend;
use gpusched_node_agent::config::Settings;
use gpusched_node_agent::plan::build_plans;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn fmt(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

struct Spawned {
    child: Child,
    kubelet: FakeKubelet,
    endpoint: String,
    control: std::path::PathBuf,
    metrics: String,
    _dir: tempfile::TempDir,
}

async fn spawn_agent(node: &str) -> Spawned {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await;
    let control = dir.path().join("control");
    std::fs::write(&control, "").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_gpusched-node-agent"))
        .args(["agent", "--backend", "fake", "--node-file"])
        .arg(fixture(node))
        .arg("--control-file")
        .arg(&control)
        .arg("--plugin-dir")
        .arg(dir.path())
        .args(["--metrics-address", &metrics, "--feature-file", ""])
        .args(["--quiet-period", "1h"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn agent");
    let (_, reg) = kubelet.next_registration(Duration::from_secs(10)).await;
    Spawned {
        child,
        kubelet,
        endpoint: reg.endpoint,
        control,
        metrics,
        _dir: dir,
    }
}

async fn scrape(addr: &str) -> usize {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let _ = s
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    out.len()
}

fn main() {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let n_alloc = if quick { 500 } else { 5000 };
    let n_pref = if quick { 500 } else { 5000 };
    let n_health = if quick { 20 } else { 100 };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut report = String::new();
    let mut line = |s: String| {
        println!("{s}");
        report.push_str(&s);
        report.push('\n');
    };
    line("| measure | p50 | p99 | max | goal |".into());
    line("|---|---|---|---|---|".into());

    // Pure preferred allocation (the shared model::topology::choose path).
    for (node, sizes) in [
        ("dgx-h100.yaml", vec![1usize, 2, 4, 8]),
        ("pcie-l40s.yaml", vec![2, 4]),
        ("nvl72.yaml", vec![4, 8, 16, 36]),
    ] {
        let inv = FakeBackend::from_file(&fixture(node), None)
            .unwrap()
            .inventory_ref()
            .clone();
        let plan = &build_plans(&inv, &Settings::default()).unwrap()[0];
        let ids: Vec<String> = plan.devices.iter().map(|d| d.id.clone()).collect();
        let healthy = vec![true; plan.units.len()];
        for k in sizes {
            let iters = if inv.gpus.len() > 8 {
                n_pref / 5
            } else {
                n_pref
            };
            let mut v = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                let r = plan.preferred(&ids, &[], k as i32, &healthy).unwrap();
                v.push(t.elapsed());
                assert_eq!(r.len(), k);
            }
            let max = *v.iter().max().unwrap();
            line(format!(
                "| GetPreferredAllocation (pure) {node}, {} GPUs, size {k} | {} | {} | {} | < 1 ms |",
                inv.gpus.len(),
                fmt(pct(&mut v, 0.5)),
                fmt(pct(&mut v, 0.99)),
                fmt(max)
            ));
        }
    }

    rt.block_on(async {
        for node in ["dgx-h100.yaml", "nvl72.yaml"] {
            let mut a = spawn_agent(node).await;
            let mut c = a.kubelet.client(&a.endpoint).await;
            let mut stream = c.list_and_watch(api::Empty {}).await.unwrap().into_inner();
            let first = next_list(&mut stream, Duration::from_secs(5)).await.unwrap();
            let ids: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
            let n = ids.len();

            // Preferred allocation over gRPC.
            let size = if n > 8 { 8 } else { 4 };
            let mut v = Vec::new();
            for _ in 0..n_pref / 5 {
                let t = Instant::now();
                let r = c
                    .get_preferred_allocation(api::PreferredAllocationRequest {
                        container_requests: vec![api::ContainerPreferredAllocationRequest {
                            available_device_i_ds: ids.clone(),
                            must_include_device_i_ds: vec![],
                            allocation_size: size,
                        }],
                    })
                    .await
                    .unwrap();
                v.push(t.elapsed());
                assert_eq!(r.into_inner().container_responses[0].device_i_ds.len(), size as usize);
            }
            let max = *v.iter().max().unwrap();
            line(format!(
                "| GetPreferredAllocation (gRPC round trip) {n} GPUs, size {size} | {} | {} | {} | < 1 ms |",
                fmt(pct(&mut v, 0.5)),
                fmt(pct(&mut v, 0.99)),
                fmt(max)
            ));

            if n == 8 {
                // Allocate over gRPC.
                let mut v = Vec::with_capacity(n_alloc);
                for i in 0..n_alloc {
                    let d = vec![ids[i % n].clone(), ids[(i + 1) % n].clone()];
                    let t = Instant::now();
                    let r = c
                        .allocate(api::AllocateRequest {
                            container_requests: vec![api::ContainerAllocateRequest {
                                devices_ids: d,
                            }],
                        })
                        .await
                        .unwrap();
                    v.push(t.elapsed());
                    assert_eq!(r.into_inner().container_responses.len(), 1);
                }
                let max = *v.iter().max().unwrap();
                line(format!(
                    "| Allocate (gRPC round trip, 2 GPUs) | {} | {} | {} | p99 < 1 ms |",
                    fmt(pct(&mut v, 0.5)),
                    fmt(pct(&mut v, 0.99)),
                    fmt(max)
                ));

                // Health change → ListAndWatch update.
                let mut v = Vec::with_capacity(n_health);
                for i in 0..n_health {
                    let cmd = if i % 2 == 0 { "unhealthy" } else { "healthy" };
                    let t = Instant::now();
                    {
                        let mut f = std::fs::OpenOptions::new()
                            .append(true)
                            .open(&a.control)
                            .unwrap();
                        writeln!(f, "{cmd} 3").unwrap();
                    }
                    let upd = next_list(&mut stream, Duration::from_secs(2))
                        .await
                        .expect("update");
                    v.push(t.elapsed());
                    let want = if cmd == "healthy" { "Healthy" } else { "Unhealthy" };
                    assert_eq!(upd.devices[3].health, want);
                }
                let max = *v.iter().max().unwrap();
                line(format!(
                    "| health change → ListAndWatch update (fake backend, control file) | {} | {} | {} | < 100 ms |",
                    fmt(pct(&mut v, 0.5)),
                    fmt(pct(&mut v, 0.99)),
                    fmt(max)
                ));

                // Kubelet restart → re-registration.
                let mut v = Vec::new();
                for _ in 0..5 {
                    let t = a.kubelet.restart().await;
                    let (at, _) = a.kubelet.next_registration(Duration::from_secs(3)).await;
                    v.push(at.duration_since(t));
                }
                let max = *v.iter().max().unwrap();
                line(format!(
                    "| kubelet restart → re-registration | {} | {} | {} | < 1 s |",
                    fmt(pct(&mut v, 0.5)),
                    fmt(pct(&mut v, 0.99)),
                    fmt(max)
                ));

                // Steady RSS after all of the above, with /metrics scraped.
                let bytes = scrape(&a.metrics).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                let (rss, hwm) = rss_kib(a.child.id());
                line(format!(
                    "| steady RSS, 8 fake GPUs (after the runs above; /metrics {bytes} B) | {:.1} MiB | peak {:.1} MiB | | < 10 MiB |",
                    rss as f64 / 1024.0,
                    hwm as f64 / 1024.0
                ));
            } else {
                let (rss, hwm) = rss_kib(a.child.id());
                line(format!(
                    "| steady RSS, 72 fake GPUs | {:.1} MiB | peak {:.1} MiB | | |",
                    rss as f64 / 1024.0,
                    hwm as f64 / 1024.0
                ));
            }
            let _ = a.child.kill();
            let _ = a.child.wait();
        }
    });
    if let Ok(p) = std::env::var("BENCH_REPORT") {
        let _ = std::fs::write(p, report);
    }
}
