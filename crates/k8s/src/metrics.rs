//! The scheduler's Prometheus metrics (names in `docs/kubernetes.md`).

use crate::world::{Built, Problem};
use gpusched_core::report::classify::PendingClass;
use gpusched_core::{ClusterState, CycleOutput};
use gpusched_model::GPU_MILLI;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

/// Label set `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `scheduled`, `unschedulable`, `error`.
    pub result: String,
}

/// Label set `queue`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    /// Queue name.
    pub queue: String,
}

/// Label set `kind`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `preempt`, `reclaim`; for bind errors `conflict`, `not_found`, …
    pub kind: String,
}

/// Label set `reason` (a [`PendingClass`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `insufficient-gpus`, `quota`, `gang-incomplete`, `gated`, …
    pub reason: String,
}

/// Label set `state` of the GPU counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `total`, `unhealthy`, `allocated`, `free`.
    pub state: String,
}

/// Label set `free` (free whole GPUs on a node).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FreeLabel {
    /// Number of completely free usable GPUs.
    pub free: String,
}

/// All metrics of the scheduler.
pub struct Metrics {
    registry: Registry,
    /// The standard `process_*` metrics (no prefix).
    process: Registry,
    /// Scheduling attempts by result.
    pub attempts: Family<ResultLabel, Counter>,
    /// Duration of one decision cycle (snapshot + core).
    pub cycle_seconds: Histogram,
    /// Duration of one binding call.
    pub binding_seconds: Histogram,
    /// From pod creation to a successful binding.
    pub e2e_seconds: Histogram,
    /// Pending pods per queue.
    pub pending: Family<QueueLabel, Gauge>,
    /// GPUs allocated per queue (milli-GPU / 1000).
    pub queue_allocated_gpus: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    /// GPUs deserved per queue.
    pub queue_fair_share_gpus: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    /// Evictions by kind.
    pub evictions: Family<KindLabel, Counter>,
    /// Binding errors by kind.
    pub bind_errors: Family<KindLabel, Counter>,
    /// 1 while this replica holds the lease.
    pub leader: Gauge,
    /// Nodes in the snapshot.
    pub nodes: Gauge,
    /// Pending pods by why they wait.
    pub pending_by_reason: Family<ReasonLabel, Gauge>,
    /// GPUs by state (shares as fractions).
    pub gpus: Family<StateLabel, Gauge<f64, AtomicU64>>,
    /// Free GPU capacity on GPUs partly held by shares (not usable by
    /// whole-GPU pods), in GPUs.
    pub gpus_fragmented: Gauge<f64, AtomicU64>,
    /// Schedulable GPU nodes by number of completely free GPUs.
    pub nodes_by_free_gpus: Family<FreeLabel, Gauge>,
    /// Problems of objects (malformed node annotations, unusable
    /// decisions, invalid queues, groups, pods) present now, by kind.
    pub object_problems: Family<KindLabel, Gauge>,
    /// Problems of objects reported (each once while it lasts), by kind.
    pub object_problems_total: Family<KindLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpusched");
        let attempts = Family::<ResultLabel, Counter>::default();
        for r in ["scheduled", "unschedulable", "error"] {
            let _ = attempts.get_or_create(&ResultLabel { result: r.into() });
        }
        registry.register(
            "schedule_attempts",
            "Scheduling attempts by result",
            attempts.clone(),
        );
        let cycle_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register(
            "cycle_duration_seconds",
            "Duration of a decision cycle (snapshot and core)",
            cycle_seconds.clone(),
        );
        let binding_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register(
            "binding_duration_seconds",
            "Duration of one pods/binding call",
            binding_seconds.clone(),
        );
        let e2e_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 20));
        registry.register(
            "pod_scheduling_duration_seconds",
            "From pod creation to a successful binding",
            e2e_seconds.clone(),
        );
        let pending = Family::<QueueLabel, Gauge>::default();
        registry.register("pending_pods", "Pending pods per queue", pending.clone());
        let queue_allocated_gpus = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "queue_allocated_gpus",
            "GPUs held by the queue's pods",
            queue_allocated_gpus.clone(),
        );
        let queue_fair_share_gpus = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "queue_fair_share_gpus",
            "GPUs the queue deserves now",
            queue_fair_share_gpus.clone(),
        );
        let evictions = Family::<KindLabel, Counter>::default();
        for k in ["preempt", "reclaim", "consolidate"] {
            let _ = evictions.get_or_create(&KindLabel { kind: k.into() });
        }
        registry.register("evictions", "Pods evicted, by kind", evictions.clone());
        let bind_errors = Family::<KindLabel, Counter>::default();
        // every kind from the start, at 0: a rate or increase over a series
        // that appears only with the first error misses that error
        for k in BIND_ERROR_KINDS {
            let _ = bind_errors.get_or_create(&KindLabel { kind: k.into() });
        }
        registry.register(
            "binding_errors",
            "Failed bindings, by kind",
            bind_errors.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        let nodes = Gauge::default();
        registry.register("nodes", "Nodes in the last snapshot", nodes.clone());
        let pending_by_reason = Family::<ReasonLabel, Gauge>::default();
        for c in PendingClass::ALL {
            let _ = pending_by_reason.get_or_create(&ReasonLabel {
                reason: c.as_str().into(),
            });
        }
        registry.register(
            "pending_pods_by_reason",
            "Pending pods by why they wait (doctor's classes of the core's reasons)",
            pending_by_reason.clone(),
        );
        let gpus = Family::<StateLabel, Gauge<f64, AtomicU64>>::default();
        for st in ["total", "unhealthy", "allocated", "free"] {
            let _ = gpus.get_or_create(&StateLabel { state: st.into() });
        }
        registry.register(
            "gpus",
            "GPUs by state: total, unhealthy, allocated (shares as fractions), free",
            gpus.clone(),
        );
        let gpus_fragmented = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "gpus_fragmented",
            "Free capacity on GPUs partly held by shares, in GPUs (whole-GPU pods cannot use it)",
            gpus_fragmented.clone(),
        );
        let nodes_by_free_gpus = Family::<FreeLabel, Gauge>::default();
        registry.register(
            "nodes_by_free_gpus",
            "Schedulable GPU nodes by number of completely free GPUs",
            nodes_by_free_gpus.clone(),
        );
        let object_problems = Family::<KindLabel, Gauge>::default();
        let object_problems_total = Family::<KindLabel, Counter>::default();
        for k in crate::exec::events::PROBLEM_KINDS {
            let _ = object_problems.get_or_create(&KindLabel { kind: k.into() });
            let _ = object_problems_total.get_or_create(&KindLabel { kind: k.into() });
        }
        registry.register(
            "object_problems",
            "Problems of objects present now (node, decision, queue, group, pod, gated), by kind",
            object_problems.clone(),
        );
        registry.register(
            "object_problems_reported",
            "Problems of objects reported, each once while it lasts, by kind",
            object_problems_total.clone(),
        );
        let mut process = Registry::default();
        process.register_collector(Box::new(ProcessCollector));
        Metrics {
            registry,
            process,
            attempts,
            cycle_seconds,
            binding_seconds,
            e2e_seconds,
            pending,
            queue_allocated_gpus,
            queue_fair_share_gpus,
            evictions,
            bind_errors,
            leader,
            nodes,
            pending_by_reason,
            gpus,
            gpus_fragmented,
            nodes_by_free_gpus,
            object_problems,
            object_problems_total,
        }
    }

    /// Sets the cluster gauges from a cycle: pending pods by reason, GPUs by
    /// state, fragmentation, nodes by free GPUs.
    /// `classes`: the cycle's [`gpusched_core::report::classify::classify_cycle`].
    pub fn observe_cycle(
        &self,
        built: &Built,
        out: &CycleOutput,
        classes: &BTreeMap<gpusched_core::PodId, Vec<PendingClass>>,
    ) {
        let snap = &built.snapshot;
        let mut by: BTreeMap<PendingClass, i64> =
            PendingClass::ALL.iter().map(|c| (*c, 0)).collect();
        for p in &built.problems {
            match p {
                Problem::GatedPod { .. } => *by.entry(PendingClass::Gated).or_default() += 1,
                Problem::ClaimsPending { class, .. } => *by.entry(*class).or_default() += 1,
                Problem::InvalidPod { .. } => {
                    *by.entry(PendingClass::InvalidSpec).or_default() += 1
                }
                _ => {}
            }
        }
        for e in &out.explanations {
            let Some(cs) = classes.get(&e.pod) else {
                continue;
            };
            let c = cs.first().copied().unwrap_or(PendingClass::FitsNow);
            *by.entry(c).or_default() += 1;
        }
        for (c, n) in by {
            self.pending_by_reason
                .get_or_create(&ReasonLabel {
                    reason: c.as_str().into(),
                })
                .set(n);
        }
        let (cs, _) = ClusterState::from_snapshot(snap);
        let mut total = 0u64;
        let mut unhealthy = 0u64;
        let mut free = 0u64;
        let mut frag = 0u64;
        let mut by_free: BTreeMap<u32, i64> = BTreeMap::new();
        for (n, st) in snap.nodes.iter().zip(cs.states()) {
            total += n.gpus.len() as u64;
            // a GPU in MIG mode is usable through its instances
            unhealthy += st
                .gpu_usable
                .iter()
                .zip(&st.mig_usable)
                .filter(|(u, m)| !**u && !**m)
                .count() as u64;
            free += st.free.gpu_milli;
            frag += st
                .gpu_free_milli
                .iter()
                .zip(&st.gpu_usable)
                .filter(|(m, u)| **u && (**m as u64) < GPU_MILLI)
                .map(|(m, _)| *m as u64)
                .sum::<u64>();
            if !n.gpus.is_empty() && !n.unschedulable {
                *by_free.entry(st.whole_free()).or_default() += 1;
            }
        }
        let usable = (total - unhealthy) * GPU_MILLI;
        let set = |s: &str, v: f64| {
            self.gpus
                .get_or_create(&StateLabel { state: s.into() })
                .set(v)
        };
        set("total", total as f64);
        set("unhealthy", unhealthy as f64);
        set(
            "allocated",
            usable.saturating_sub(free) as f64 / GPU_MILLI as f64,
        );
        set("free", free as f64 / GPU_MILLI as f64);
        self.gpus_fragmented.set(frag as f64 / GPU_MILLI as f64);
        self.nodes_by_free_gpus.clear();
        for (k, n) in by_free {
            self.nodes_by_free_gpus
                .get_or_create(&FreeLabel {
                    free: k.to_string(),
                })
                .set(n);
        }
    }

    /// OpenMetrics text: the standard `process_*` metrics, then ours.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode_registry(&mut s, &self.process);
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }

    /// The registry's debug text (names every registered family, also those
    /// without samples, which the exposition leaves out): for the test that
    /// checks `docs/metrics.md` and the dashboards.
    #[doc(hidden)]
    pub fn registry_debug(&self) -> String {
        format!("{:?}", self.registry)
    }

    /// Counts an attempt.
    pub fn attempt(&self, result: &str) {
        self.attempts
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::{GpuAssignment, PodPhase, PodState};
    use gpusched_model::{Gpu, GpuHealth, GpuRequest, Node, Pod, ResourceVec};

    #[test]
    fn cluster_gauges_follow_the_snapshot() {
        let gpu = |i: u32, h: bool| Gpu {
            index: i,
            uuid: format!("g{i}"),
            model: "H100".into(),
            memory_mib: 80_000,
            health: if h {
                GpuHealth::Healthy
            } else {
                GpuHealth::Unhealthy
            },
            topo: Default::default(),
            mig: Vec::new(),
        };
        let n = Node::new(
            "n",
            ResourceVec::new(64_000, 1 << 40, 0),
            vec![gpu(0, true), gpu(1, true), gpu(2, true), gpu(3, false)],
        );
        let mut share = Pod::new("ml/s", "default");
        share.gpu = GpuRequest::Share {
            milli: 300,
            memory_mib: 0,
        };
        let mut whole = Pod::new("ml/w", "default");
        whole.gpu = GpuRequest::Whole(1);
        let mut big = Pod::new("ml/big", "default");
        big.gpu = GpuRequest::Whole(4);
        let mut built = Built::default();
        built.snapshot.nodes.push(n);
        built
            .snapshot
            .queues
            .push(gpusched_model::Queue::new("default"));
        built.snapshot.pods = vec![
            PodState {
                pod: share.into(),
                phase: PodPhase::Running {
                    node: 0,
                    gpus: GpuAssignment::Share {
                        gpu: 0,
                        milli: 300,
                        memory_mib: 0,
                    },
                    since_ms: 0,
                },
            },
            PodState {
                pod: whole.into(),
                phase: PodPhase::Running {
                    node: 0,
                    gpus: GpuAssignment::Whole(vec![1]),
                    since_ms: 0,
                },
            },
            PodState::pending(big),
        ];
        let mut s = gpusched_plugins::config::build(&Default::default()).unwrap();
        let out = s.cycle(&built.snapshot, 0, 1);
        let m = Metrics::new();
        let classes = gpusched_core::report::classify::classify_cycle(&out, &built.snapshot);
        m.observe_cycle(&built, &out, &classes);
        let text = m.render();
        for line in [
            "gpusched_gpus{state=\"total\"} 4.0",
            "gpusched_gpus{state=\"unhealthy\"} 1.0",
            "gpusched_gpus{state=\"allocated\"} 1.3",
            "gpusched_gpus{state=\"free\"} 1.7",
            "gpusched_gpus_fragmented 0.7",
            "gpusched_nodes_by_free_gpus{free=\"1\"} 1",
            // 4 GPUs asked of a node with one unhealthy: the unhealthy GPU is why
            "gpusched_pending_pods_by_reason{reason=\"UnhealthyGpus\"} 1",
            "gpusched_pending_pods_by_reason{reason=\"QueueQuota\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}

/// Every `kind` of `gpusched_binding_errors_total` (exec: bindings).
pub const BIND_ERROR_KINDS: [&str; 7] = [
    "conflict",
    "not_found",
    "rejected",
    "throttled",
    "server",
    "transport",
    "overbooked",
];

/// The standard process metrics under client_golang's names
/// (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_virtual_memory_bytes`, `process_open_fds`,
/// `process_start_time_seconds`), read from `/proc/self` at each scrape;
/// none where `/proc` is unreadable.
#[derive(Debug)]
struct ProcessCollector;

/// What `/proc/self` says of this process.
#[derive(Debug, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    rss_bytes: i64,
    virtual_bytes: i64,
    open_fds: i64,
    start_time_seconds: f64,
}

/// Clock ticks per second of `/proc/*/stat` times: USER_HZ, 100 on every
/// Linux architecture.
const USER_HZ: f64 = 100.0;

/// Parses `/proc/self/stat`, `/proc/self/status` (`VmRSS`) and
/// `/proc/stat` (`btime`); `None` when a field is missing.
fn parse_process(stat: &str, status: &str, proc_stat: &str, open_fds: i64) -> Option<ProcessStats> {
    // the command name in parentheses may hold spaces: fields after it
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): utime 14, stime 15, starttime 22, vsize 23
    let num = |i: usize| f.get(i)?.parse::<u64>().ok();
    let cpu_ticks = num(11)? + num(12)?;
    let start_ticks = num(19)?;
    let vsize = num(20)?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let btime: u64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(ProcessStats {
        cpu_seconds: cpu_ticks as f64 / USER_HZ,
        rss_bytes: (rss_kib * 1024) as i64,
        virtual_bytes: vsize as i64,
        open_fds,
        start_time_seconds: btime as f64 + start_ticks as f64 / USER_HZ,
    })
}

fn read_process() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let proc_stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
    parse_process(&stat, &status, &proc_stat, fds)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = read_process() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(enc.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        for (name, help, v) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.rss_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                p.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                p.open_fds,
            ),
        ] {
            let g = ConstGauge::new(v);
            g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let start = ConstGauge::new(p.start_time_seconds);
        start.encode(enc.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            None,
            start.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod process_tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let stat = "4242 (gpu sched) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 8 0 1200 1073741824 5000 18446744073709551615";
        let status = "Name:\tgpusched\nVmPeak:\t  2000 kB\nVmRSS:\t   20480 kB\n";
        let proc_stat = "cpu  1 2 3\nbtime 1764000000\nprocesses 9\n";
        let p = parse_process(stat, status, proc_stat, 17).unwrap();
        assert_eq!(
            p,
            ProcessStats {
                cpu_seconds: 3.0,
                rss_bytes: 20480 * 1024,
                virtual_bytes: 1_073_741_824,
                open_fds: 17,
                start_time_seconds: 1_764_000_012.0,
            }
        );
        assert_eq!(parse_process("garbage", status, proc_stat, 1), None);
        assert_eq!(parse_process(stat, "Name: x\n", proc_stat, 1), None);
    }

    #[test]
    fn exposition_has_process_metrics_and_zero_series_from_the_start() {
        let text = Metrics::new().render();
        for want in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
            "gpusched_binding_errors_total{kind=\"overbooked\"} 0",
            "gpusched_pending_pods_by_reason{reason=\"QueueQuota\"} 0",
            "gpusched_gpus{state=\"total\"} 0",
        ] {
            assert!(text.contains(want), "no {want:?} in\n{text}");
        }
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    }
}
