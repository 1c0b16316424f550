//! The scheduler's Prometheus metrics (names in `docs/kubernetes.md`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
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
        }
    }

    /// OpenMetrics text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
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
