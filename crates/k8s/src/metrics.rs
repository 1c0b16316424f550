//! The scheduler's Prometheus metrics (names in `docs/kubernetes.md`).

use crate::world::{Built, Problem};
use gpusched_core::{ClusterState, CycleOutput};
use gpusched_model::GPU_MILLI;
use gpusched_plugins::classify::PendingClass;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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
        registry.register(
            "pending_pods_by_reason",
            "Pending pods by why they wait (doctor's classes of the core's reasons)",
            pending_by_reason.clone(),
        );
        let gpus = Family::<StateLabel, Gauge<f64, AtomicU64>>::default();
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
        Metrics {
            registry,
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
    /// `classes`: the cycle's [`gpusched_plugins::classify::classify_cycle`].
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
            unhealthy += st.gpu_usable.iter().filter(|u| !**u).count() as u64;
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
        set("allocated", usable.saturating_sub(free) as f64 / 1000.0);
        set("free", free as f64 / 1000.0);
        self.gpus_fragmented.set(frag as f64 / 1000.0);
        self.nodes_by_free_gpus.clear();
        for (k, n) in by_free {
            self.nodes_by_free_gpus
                .get_or_create(&FreeLabel {
                    free: k.to_string(),
                })
                .set(n);
        }
    }

    /// OpenMetrics text.
    pub fn render(&self) -> String {
        let mut s = String::new();
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
                pod: share,
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
                pod: whole,
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
        let classes = gpusched_plugins::classify::classify_cycle(&out, &built.snapshot);
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
            "gpusched_pending_pods_by_reason{reason=\"unhealthy-gpus\"} 1",
            "gpusched_pending_pods_by_reason{reason=\"quota\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
