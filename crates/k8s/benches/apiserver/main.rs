//! Side-by-side API benchmark (issue 6): on a real kube-apiserver with kwok
//! nodes, how fast do pods get bound by gpusched, by the upstream
//! kube-scheduler of the same Kubernetes version, and by a round-robin
//! binder that decides nothing (the apiserver's bind ceiling)?
//!
//! Each (contender, QPS setting, mix) row gets a **fresh cluster** (etcd +
//! kube-apiserver + kwok from `e2e/cluster/cluster up`), so no row inherits
//! another's etcd history, watch cache or leftover objects. Per row:
//! nodes are created and made Ready by kwok, the contender is started and
//! given time to sync (mode `stream`, the default), then the pods are
//! created as fast as a bounded-concurrency creator can. A watch on the
//! pods records when each pod is first seen with `spec.nodeName`; the
//! creator records when each create call returned. Latency per pod = watch
//! bind time − local create completion (not `creationTimestamp`, which has
//! second resolution). Throughput = pods / (last bind seen − first create
//! started). Mode `backlog` creates every pod first and starts the
//! contender afterwards: pure drain rate, latencies then include the wait.
//!
//! ```text
//! cargo bench -p gpusched-k8s --bench apiserver -- --help
//! ```

use futures::StreamExt;
use gpusched_k8s::controller::{self, Options};
use gpusched_k8s::crd::{PodGroup, Queue, SpPodGroup};
use gpusched_k8s::exec::ExecOptions;
use gpusched_k8s::kwok::node_object;
use gpusched_k8s::limiter::Limiter;
use k8s_openapi::api::core::v1::{Binding, Namespace, Node, ObjectReference, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, CustomResourceExt};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// the harness, by what each part does (this file: arguments, one row, the
// table)
mod cluster;
mod contenders;
mod measure;
mod workload;

use cluster::*;
use contenders::*;
use measure::*;
use workload::*;

const NS: &str = "bench";
const HELP: &str = "apiserver bench: gpusched vs kube-scheduler vs a round-robin binder on kube-apiserver + kwok

  --pods N              pods per row (default 1000)
  --nodes N             kwok nodes, 8 H100 each (default: pods/8 rounded up: exactly full)
  --throttled-pods N    pods for rows with qps > 0 (default: --pods)
  --contenders LIST     gpusched,kube-scheduler,rr,rr-ev (default: the first three;
                        rr-ev = rr plus one Scheduled event per pod, as the schedulers write)
  --qps LIST            0 = unthrottled (kube-scheduler: 5000/10000), else qps with burst 2*qps (default 0,50)
  --mix LIST            single (1-GPU pods), gang (60% in PodGroups of 8-32) (default single)
  --mode stream|backlog contender running while pods are created (default), or started after
  --queues N            gpusched Queues q-0..q-N-1 (weight 1, may borrow) with the pods spread over
                        them round-robin (default 0: every pod in queue default; kube-scheduler and rr
                        get the same pods, the label means nothing to them)
  --create-concurrency N  pod creations in flight (default 64)
  --bind-concurrency N  gpusched and rr bindings in flight (default 64)
  --gpusched-bin PATH   run gpusched as a process (RSS measured) instead of in-process;
                        GPUSCHED_BENCH_ARGS (whitespace-separated) adds flags, e.g. --debounce-ms 100
  --timeout S           give up on a row after S seconds (default 900)
  --probe N             after the drain, create N more 1-GPU pods one at a time (200 ms apart) and
                        report create → bound (the pod watch) per pod, up to 30 s each (later: a
                        miss, counted); when the workload leaves < N GPUs free, the probe pods get
                        their own nodes (one per 8, tainted gpusched.io/probe=true:NoSchedule; the
                        probe pods tolerate and select it). gpusched also: the duration of the
                        first cycle after each (its cycle histogram: sum and count before and after)
  --keep                leave each cluster directory for inspection";

#[derive(Clone, Debug)]
struct Args {
    pods: usize,
    nodes: Option<usize>,
    throttled_pods: Option<usize>,
    contenders: Vec<String>,
    qps: Vec<f64>,
    mixes: Vec<String>,
    backlog: bool,
    queues: usize,
    create_concurrency: usize,
    bind_concurrency: usize,
    gpusched_bin: Option<PathBuf>,
    timeout: Duration,
    probe: usize,
    keep: bool,
}

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

fn parse_args() -> Args {
    let mut a = Args {
        pods: 1000,
        nodes: None,
        throttled_pods: None,
        contenders: list("gpusched,kube-scheduler,rr"),
        qps: vec![0.0, 50.0],
        mixes: vec!["single".into()],
        backlog: false,
        queues: 0,
        create_concurrency: 64,
        bind_concurrency: 64,
        gpusched_bin: None,
        timeout: Duration::from_secs(900),
        probe: 0,
        keep: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let k = argv[i].as_str();
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        let mut took = true;
        match k {
            "--pods" => a.pods = v.parse().expect("--pods"),
            "--nodes" => a.nodes = Some(v.parse().expect("--nodes")),
            "--throttled-pods" => a.throttled_pods = Some(v.parse().expect("--throttled-pods")),
            "--contenders" => a.contenders = list(&v),
            "--qps" => a.qps = list(&v).iter().map(|q| q.parse().expect("--qps")).collect(),
            "--mix" => a.mixes = list(&v),
            "--mode" => a.backlog = v == "backlog",
            "--queues" => a.queues = v.parse().expect("--queues"),
            "--create-concurrency" => a.create_concurrency = v.parse().expect("n"),
            "--bind-concurrency" => a.bind_concurrency = v.parse().expect("n"),
            "--gpusched-bin" => a.gpusched_bin = Some(resolve_bin(&v)),
            "--timeout" => a.timeout = Duration::from_secs(v.parse().expect("s")),
            "--probe" => a.probe = v.parse().expect("--probe"),
            "--keep" => {
                a.keep = true;
                took = false;
            }
            "--help" | "-h" => {
                println!("{HELP}");
                std::process::exit(0);
            }
            _ => took = false, // cargo's --bench and friends
        }
        i += if took { 2 } else { 1 };
    }
    a
}

struct Row {
    contender: String,
    qps: String,
    mix: String,
    nodes: usize,
    pods: usize,
    bound: usize,
    create_rate: f64,
    throughput: f64,
    drain_rate: f64,
    p50: f64,
    p99: f64,
    max: f64,
    rss: Option<(f64, f64)>,
    cpu: Option<f64>,
    extra: String,
    load: String,
}

async fn run_row(a: &Args, who: &str, qps: f64, mix: &str) -> Row {
    let pods_n = if qps > 0.0 {
        a.throttled_pods.unwrap_or(a.pods)
    } else {
        a.pods
    };
    let nodes_n = a.nodes.unwrap_or(pods_n.div_ceil(8));
    let t_row = Instant::now();
    let c = Cluster::up(a.keep).await;
    install_crds(&c.client).await;
    make_queues(&c.client, a.queues).await;
    let (nodes, nodes_created, nodes_ready) = make_nodes(&c.client, nodes_n).await;
    eprintln!(
        "[{who} qps={qps} {mix}] cluster up, {nodes_n} nodes created in {nodes_created:.1}s, Ready after {nodes_ready:.1}s"
    );
    // before the contender starts; not in `nodes` (rr binds to those)
    let probe_nodes = make_probe_nodes(&c.client, a.probe, nodes_n, pods_n).await;
    let (pods, groups) = workload(pods_n, mix == "gang");
    let scheduler_name = match who {
        "gpusched" => "gpusched",
        "kube-scheduler" => "default-scheduler",
        _ => "bench-rr",
    };
    let seen = Arc::new(Seen::default());
    let watch = start_watch(&c.client, seen.clone());
    let creator = client_for(&c.kubeconfig()).await;
    let mut running = None;
    let mut started = Instant::now();
    if !a.backlog {
        let (r, t) = start_contender(a, &c, who, qps, &nodes).await;
        running = Some(r);
        started = t;
        // let it settle (watches synced, first empty cycles)
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (done, t_create, create_secs) = create_pods(
        &creator,
        &pods,
        &groups,
        scheduler_name,
        a.create_concurrency,
        a.queues,
    )
    .await;
    eprintln!(
        "[{who} qps={qps} {mix}] {pods_n} pods created in {create_secs:.1}s ({:.0}/s); {} bound so far",
        pods_n as f64 / create_secs,
        seen.count.load(Ordering::SeqCst)
    );
    if a.backlog {
        let (r, t) = start_contender(a, &c, who, qps, &nodes).await;
        running = Some(r);
        started = t;
    }
    let running = running.unwrap();
    let cp_pids: Vec<(&str, Option<u32>)> = ["kube-apiserver", "etcd", "kwok"]
        .into_iter()
        .map(|k| (k, c.pid(k)))
        .collect();
    let cp_cpu0: Vec<f64> = cp_pids
        .iter()
        .map(|(_, p)| p.and_then(cpu_seconds).unwrap_or(0.0))
        .collect();
    let t_wait = Instant::now();
    let mut last = 0;
    let mut last_change = Instant::now();
    // the cycle histogram as of the last bind (sampled at most once a
    // second while binds arrive): decision time in the drain alone, not
    // in the quiet wait that ends a row
    let metrics_port = match &running {
        Running::InProcess { metrics_port, .. } => Some(*metrics_port),
        Running::Process { metrics_port, .. } => *metrics_port,
        _ => None,
    };
    let mut at_last_bind: Option<(f64, f64, Instant)> = None;
    let mut sampled = 0;
    let mut last_sample = Instant::now() - Duration::from_secs(1);
    loop {
        let n = seen.count.load(Ordering::SeqCst);
        if let Some(port) = metrics_port
            && n != sampled
            && (last_sample.elapsed() >= Duration::from_secs(1) || n >= pods_n)
        {
            last_sample = Instant::now();
            if let Some((s, c)) = cycle_totals(port).await {
                sampled = n;
                at_last_bind = Some((s, c, Instant::now()));
            }
        }
        if n >= pods_n {
            break;
        }
        if n != last {
            last = n;
            last_change = Instant::now();
        }
        if t_wait.elapsed() > a.timeout || last_change.elapsed() > Duration::from_secs(120) {
            eprintln!("[{who}] giving up with {n}/{pods_n} bound");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // settle a moment so in-flight writes (events) finish before reading RSS
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = running.pid().and_then(rss_mib);
    let cpu = running.pid().and_then(cpu_seconds);
    let cp_cpu: Vec<String> = cp_pids
        .iter()
        .zip(&cp_cpu0)
        .map(|((k, p), c0)| format!("{k} {:.1}", p.and_then(cpu_seconds).unwrap_or(0.0) - c0))
        .collect();
    let api_rss = cp_pids[0].1.and_then(rss_mib).map(|r| r.0).unwrap_or(0.0);
    let mut extra = String::new();
    let bound: HashMap<String, Instant> = seen.bound.lock().unwrap().clone();
    let bound_n = bound.len();
    let first_bind = bound.values().min().copied();
    let last_bind = bound.values().max().copied();
    if let Some(port) = metrics_port
        && let Some(m) = http_get(port, "/metrics").await
    {
        let cyc_sum = metric(&m, "gpusched_cycle_duration_seconds_sum");
        let cyc_n = metric(&m, "gpusched_cycle_duration_seconds_count");
        let sched = metric(&m, "gpusched_schedule_attempts_total{result=\"scheduled\"}");
        let unsched = metric(
            &m,
            "gpusched_schedule_attempts_total{result=\"unschedulable\"}",
        );
        let bind_sum = metric(&m, "gpusched_binding_duration_seconds_sum");
        let bind_n = metric(&m, "gpusched_binding_duration_seconds_count");
        let window = match (first_bind, last_bind) {
            (Some(f), Some(l)) => l.duration_since(f).as_secs_f64().max(1e-3),
            _ => f64::NAN,
        };
        extra = format!(
            "{cyc_n:.0} cycles, {cyc_sum:.2} s in cycles ({:.1} ms/cycle); {sched:.0} bound + {unsched:.0} unschedulable attempts; decisions/s in cycles {:.0}; binds/s over bind window {:.0}; mean bind call {:.1} ms",
            1000.0 * cyc_sum / cyc_n.max(1.0),
            sched / cyc_sum.max(1e-9),
            bound_n as f64 / window,
            1000.0 * bind_sum / bind_n.max(1.0),
        );
    }
    if let Some((s, c, t)) = at_last_bind {
        let wall = t.duration_since(started).as_secs_f64();
        extra = format!(
            "{extra}; until the last bind (sampled within 1 s of it): {c:.0} cycles, {s:.2} s in cycles of {wall:.1} s from contender start ({:.0} %)",
            100.0 * s / wall.max(1e-9)
        );
    }
    // after the row's binds and metrics are read: probe pods that bind do not count
    let probe = if a.probe > 0 {
        probe(
            &creator,
            &seen,
            metrics_port,
            a.probe,
            scheduler_name,
            probe_nodes.len(),
        )
        .await
    } else {
        String::new()
    };
    if !probe.is_empty() {
        extra = if extra.is_empty() {
            probe
        } else {
            format!("{extra}; {probe}")
        };
    }
    extra = format!(
        "{extra}{}control-plane CPU s from end of creation to last bind: {}; kube-apiserver peak RSS {api_rss:.0} MiB; {:.1} s from contender start to last bind",
        if extra.is_empty() { "" } else { "; " },
        cp_cpu.join(", "),
        last_bind
            .map(|l| l.duration_since(started).as_secs_f64())
            .unwrap_or(f64::NAN),
    );
    let mut lat: Vec<f64> = pods
        .iter()
        .filter_map(|(name, _)| {
            let b = bound.get(name)?;
            let c = done.get(name)?;
            Some(b.saturating_duration_since(*c).as_secs_f64() * 1000.0)
        })
        .collect();
    lat.sort_by(|x, y| x.total_cmp(y));
    let throughput = match last_bind {
        Some(l) => bound_n as f64 / l.duration_since(t_create).as_secs_f64(),
        None => 0.0,
    };
    let drain_rate = match (first_bind, last_bind) {
        (Some(f), Some(l)) if bound_n > 1 => {
            (bound_n - 1) as f64 / l.duration_since(f.max(started)).as_secs_f64()
        }
        _ => 0.0,
    };
    running.stop().await;
    watch.abort();
    let load = loadavg();
    eprintln!(
        "[{who} qps={qps} {mix}] done in {:.0}s (load {load})",
        t_row.elapsed().as_secs_f64()
    );
    Row {
        contender: who.to_string(),
        qps: if qps > 0.0 {
            format!("{qps}/{}", (qps * 2.0) as u32)
        } else if who == "kube-scheduler" {
            "5000/10000".into()
        } else {
            "unthrottled".into()
        },
        mix: if a.queues > 0 {
            format!("{mix}, {} queues", a.queues)
        } else {
            mix.to_string()
        },
        nodes: nodes_n,
        pods: pods_n,
        bound: bound_n,
        create_rate: pods_n as f64 / create_secs,
        throughput,
        drain_rate,
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        max: lat.last().copied().unwrap_or(f64::NAN),
        rss,
        cpu,
        extra,
        load,
    }
}

fn main() {
    let a = parse_args();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        eprintln!("args: {a:?}; load {}", loadavg());
        let mut rows = Vec::new();
        for mix in &a.mixes {
            for qps in &a.qps {
                for who in &a.contenders {
                    let r = run_row(&a, who, *qps, mix).await;
                    print_rows(std::slice::from_ref(&r), rows.is_empty());
                    rows.push(r);
                }
            }
        }
        println!(
            "\n## all rows ({} mode)\n",
            if a.backlog { "backlog" } else { "stream" }
        );
        print_rows(&rows, true);
        println!();
        for r in &rows {
            if !r.extra.is_empty() {
                println!("- {} {} {}: {}", r.contender, r.qps, r.mix, r.extra);
            }
        }
    });
}

fn print_rows(rows: &[Row], header: bool) {
    if header {
        println!(
            "| contender | client QPS/burst | mix | nodes | pods | bound | create/s | pods/s (create→last bind) | bind-window pods/s | p50 ms | p99 ms | max ms | RSS peak/now MiB | CPU s | load |"
        );
        println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    }
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            r.contender,
            r.qps,
            r.mix,
            r.nodes,
            r.pods,
            r.bound,
            r.create_rate,
            r.throughput,
            r.drain_rate,
            r.p50,
            r.p99,
            r.max,
            r.rss
                .map(|(h, n)| format!("{h:.0}/{n:.0}"))
                .unwrap_or_else(|| "–".into()),
            r.cpu
                .map(|c| format!("{c:.1}"))
                .unwrap_or_else(|| "–".into()),
            r.load
        );
    }
}
