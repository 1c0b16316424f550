//! The workload-file vocabulary (YAML) and its expansion into a
//! [`Scenario`]: queues, jobs (each job one or more pods, optionally a
//! gang), cluster events (failures, drains) and simulator settings.
//!
//! Every struct denies unknown fields. Values that need checking after
//! parsing (quantities, durations, names) are kept [`Spanned`] so that an
//! error can name the line they came from. See `docs/simulator.md` for the
//! schema with examples.

pub use gpusched_model::duration::{fmt_duration, parse_duration_ms};
use gpusched_model::validate::{ContainerResources, pod_resources};
use gpusched_model::yaml::LoadError;
use gpusched_model::{
    Node, Pod, PodConstraints, PodGroup, Queue, ResourceKind, ResourceLimit, ResourceVec,
    Toleration, TopologyConstraint, TopologyLevel,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;
use std::collections::{BTreeMap, BTreeSet};

mod expand;
pub(crate) use expand::Ctx;

type S<T> = Spanned<T>;

/// A whole workload file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    /// Optional name shown in reports.
    #[serde(default)]
    pub name: Option<String>,
    /// Queues of the queue tree.
    #[serde(default)]
    pub queues: Vec<QueueSpec>,
    /// Kinds of jobs that arrive.
    #[serde(default)]
    pub jobs: Vec<JobSpec>,
    /// Node and GPU events (failures, drains, recoveries).
    #[serde(default)]
    pub events: Vec<EventSpec>,
    /// Run settings.
    #[serde(default)]
    pub settings: Option<SettingsSpec>,
}

/// A queue (`gpusched.io/v1alpha1 Queue`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSpec {
    /// Queue name.
    pub name: S<String>,
    /// Parent queue (default: the root).
    #[serde(default)]
    pub parent: Option<S<String>>,
    /// Weight among siblings for fair share (default 1).
    #[serde(default = "one")]
    pub weight: S<u32>,
    /// Guaranteed resources (the Queue CRD's `guaranteed`): `cpu`,
    /// `memory`, `gpu` (whole GPUs, may be fractional: `"0.5"`) and
    /// extended resources, as quantity strings.
    #[serde(default)]
    pub guaranteed: Option<BTreeMap<String, S<String>>>,
    /// Deprecated spelling of `guaranteed` (read, with a warning).
    #[serde(default)]
    pub guarantee: Option<BTreeMap<String, S<String>>>,
    /// Guaranteed GPUs per model (`{H100-SXM5-80GB: "16"}`; the CRD's
    /// `guaranteedGpusByModel`).
    #[serde(default)]
    pub guaranteed_gpus_by_model: Option<BTreeMap<String, S<String>>>,
    /// Deprecated spelling of `guaranteed_gpus_by_model`.
    #[serde(default)]
    pub gpu_guarantee_by_model: Option<BTreeMap<String, S<String>>>,
    /// Hard cap, in the same keys as `guaranteed` (default: none).
    #[serde(default)]
    pub limit: Option<BTreeMap<String, S<String>>>,
    /// May use more than the guarantee while others idle (default true;
    /// the CRD's `borrow`).
    #[serde(default)]
    pub borrow: Option<bool>,
    /// Deprecated spelling of `borrow`.
    #[serde(default)]
    pub can_borrow: Option<bool>,
    /// What it borrowed may be reclaimed (default true).
    #[serde(default = "yes")]
    pub reclaimable: bool,
    /// How long its pods run before they may be preempted or reclaimed
    /// (`5m`; default: the parent's, else the scheduler's
    /// `min_runtime_ms`).
    #[serde(default)]
    pub min_runtime: Option<S<String>>,
}

/// A kind of job; `count` instances of it arrive over time.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Instances are named `<name>-0`, `<name>-1`, …; pods `<job>-p0`, ….
    pub name: S<String>,
    /// Queue the instances are submitted to.
    pub queue: S<String>,
    /// Number of job instances.
    #[serde(default = "one")]
    pub count: S<u32>,
    /// Arrival of the first instance (duration from the start, e.g. `10m`).
    #[serde(default)]
    pub arrival: Option<S<String>>,
    /// Gap between instances (`every: 5m`); with `poisson: true` the mean of
    /// an exponential gap.
    #[serde(default)]
    pub every: Option<S<String>>,
    /// Exponential gaps (a Poisson process) instead of fixed ones.
    #[serde(default)]
    pub poisson: bool,
    /// Run time of each pod once started (`2h`); with `duration_max`,
    /// uniform in `[duration, duration_max]`.
    pub duration: S<String>,
    /// Upper end of a uniform run time (see `duration`).
    #[serde(default)]
    pub duration_max: Option<S<String>>,
    /// Pods per job instance.
    #[serde(default = "one")]
    pub pods: S<u32>,
    /// Make each instance a gang (pod group).
    #[serde(default)]
    pub gang: Option<GangSpec>,
    /// Priority of its pods.
    #[serde(default)]
    pub priority: i32,
    /// Whether its pods may be preempted or reclaimed (default true).
    #[serde(default = "yes")]
    pub preemptible: bool,
    /// Per-pod requests as Kubernetes quantity strings: `cpu`, `memory`,
    /// `nvidia.com/gpu`, `gpusched.io/gpu-milli`,
    /// `gpusched.io/gpu-memory-mib`, other extended resources.
    #[serde(default)]
    pub requests: BTreeMap<String, S<String>>,
    /// Allowed GPU models (default: any).
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Minimum memory of each GPU used (`40Gi`).
    #[serde(default)]
    pub min_gpu_memory: Option<S<String>>,
    /// Labels a node must carry.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Taints its pods tolerate.
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// Labels of its pods (what other pods' affinity and spread select).
    /// Every pod also carries `gpusched.io/sim-job: <instance name>`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Inter-pod affinity and anti-affinity, topology spread, host ports,
    /// preferred node affinity (the model's `PodConstraints`: keys
    /// `required_affinity`, `required_anti_affinity`, `preferred_affinity`,
    /// `preferred_anti_affinity`, `spread`, `host_ports`,
    /// `preferred_node_affinity`). A selector value `$job` stands for the
    /// instance's name, so `{key: gpusched.io/sim-job, operator: In,
    /// values: [$job]}` selects the pods of the same instance (one trainer
    /// per node: required anti-affinity to `$job` over
    /// `kubernetes.io/hostname`).
    #[serde(default)]
    pub constraints: Option<PodConstraints>,
}

/// The label every simulated pod carries: its job instance's name.
pub const LABEL_SIM_JOB: &str = "gpusched.io/sim-job";

/// `constraints` with every selector value `$job` replaced by `job`.
fn for_instance(c: &PodConstraints, job: &str) -> PodConstraints {
    let mut c = c.clone();
    let fix = |s: &mut Option<gpusched_model::LabelSelector>| {
        for r in s.iter_mut().flat_map(|s| s.requirements.iter_mut()) {
            for v in &mut r.values {
                if v == "$job" {
                    *v = job.to_string();
                }
            }
        }
    };
    for t in c
        .required_affinity
        .iter_mut()
        .chain(c.required_anti_affinity.iter_mut())
    {
        fix(&mut t.selector);
    }
    for w in c
        .preferred_affinity
        .iter_mut()
        .chain(c.preferred_anti_affinity.iter_mut())
    {
        fix(&mut w.term.selector);
    }
    for s in &mut c.spread {
        fix(&mut s.selector);
    }
    c
}

/// Gang settings of a job.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GangSpec {
    /// Default: every pod of the job.
    #[serde(default)]
    pub min_member: Option<S<u32>>,
    /// Level at which members must (or should) be placed together.
    #[serde(default)]
    pub topology: Option<TopologyLevel>,
    /// Whether the topology constraint is required (default) or preferred.
    #[serde(default = "yes")]
    pub required: bool,
    /// Schedule timeout (`30m`).
    #[serde(default)]
    pub timeout: Option<S<String>>,
}

/// What happens to a node (or one of its GPUs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// The node goes down; its pods fail and are retried with backoff.
    NodeFailure,
    /// The node comes back.
    NodeRecovery,
    /// One GPU turns unhealthy; pods using it fail and are retried.
    GpuFailure,
    /// The GPU is healthy again.
    GpuRecovery,
    /// Cordon and evict every pod (retried at once, no backoff).
    Drain,
    /// The node takes pods again.
    Uncordon,
}

/// A cluster event.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// When, as a duration from the start (`2h`).
    pub at: S<String>,
    /// What happens.
    pub kind: EventKind,
    /// The node it happens to.
    pub node: S<String>,
    /// GPU position on the node (gpu-failure, gpu-recovery).
    #[serde(default)]
    pub gpu: Option<S<u32>>,
    /// Schedule the matching recovery / uncordon this long after.
    #[serde(default)]
    pub recover_after: Option<S<String>>,
}

/// Simulator settings (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsSpec {
    /// At most one cycle per this interval (default `1s`).
    #[serde(default)]
    pub cycle_interval: Option<S<String>>,
    /// While pods wait, a cycle at least this often (default `30s`).
    #[serde(default)]
    pub tick: Option<S<String>>,
    /// Failures a pod (or gang) survives (default 3).
    #[serde(default)]
    pub retry_limit: Option<u32>,
    /// First retry delay, doubled per retry (default `10s`).
    #[serde(default)]
    pub backoff: Option<S<String>>,
    /// Longest retry delay (default `5m`).
    #[serde(default)]
    pub backoff_max: Option<S<String>>,
    /// Hard end of the run (default: none).
    #[serde(default)]
    pub until: Option<S<String>>,
    /// Stop after this long without change (default `1h`).
    #[serde(default)]
    pub idle_stop: Option<S<String>>,
    /// How long a pod the scheduler evicts keeps its resources before it
    /// is gone and pending again (Kubernetes' termination grace period;
    /// default `0`: at once).
    #[serde(default)]
    pub termination_grace: Option<S<String>>,
}

fn one<T: From<u8>>() -> S<T> {
    unspanned(T::from(1u8))
}

/// A value without a known location (defaults).
pub(crate) fn unspanned<T>(v: T) -> S<T> {
    Spanned::new(
        v,
        serde_saphyr::Location::UNKNOWN,
        serde_saphyr::Location::UNKNOWN,
    )
}
fn yes() -> bool {
    true
}

/// Settings of a run (virtual milliseconds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimSettings {
    /// At most one cycle per this many ms (events are coalesced).
    pub cycle_interval_ms: u64,
    /// While pods wait, run a cycle at least this often.
    pub tick_ms: u64,
    /// Failures a pod (or gang) survives; one more and it is failed.
    pub retry_limit: u32,
    /// First retry delay after a failure; doubles per retry.
    pub backoff_ms: u64,
    /// Longest retry delay.
    pub backoff_max_ms: u64,
    /// Hard end of the run.
    pub until_ms: Option<u64>,
    /// Stop when nothing but periodic cycles is left and nothing changed
    /// for this long.
    pub idle_stop_ms: u64,
    /// Rebuild the cluster state after every cycle and event and check
    /// conservation (no GPU overcommitted).
    pub verify: bool,
    /// How long a pod evicted by the scheduler (preempted, reclaimed,
    /// moved) stays terminating, holding what it held, before it is gone
    /// and pending again (0: at once).
    #[serde(default)]
    pub termination_grace_ms: u64,
}

impl Default for SimSettings {
    fn default() -> Self {
        SimSettings {
            cycle_interval_ms: 1_000,
            tick_ms: 30_000,
            retry_limit: 3,
            backoff_ms: 10_000,
            backoff_max_ms: 300_000,
            until_ms: None,
            idle_stop_ms: 3_600_000,
            verify: false,
            termination_grace_ms: 0,
        }
    }
}

/// One job instance: its pods share everything but the name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// Instance name (`<kind>-<i>`).
    pub name: String,
    /// The job kind (the `name` in the workload file).
    pub kind: String,
    /// Queue it is submitted to.
    pub queue: String,
    /// Arrival, virtual ms.
    pub arrival_ms: u64,
    /// Run time of each pod once started, ms.
    pub duration_ms: u64,
    /// Number of pods.
    pub pods: u32,
    /// Pod template; `name` is the job name, `arrival_ms` the job's.
    pub template: Pod,
    /// Its gang, if it is one.
    pub group: Option<PodGroup>,
}

/// A cluster event at a virtual time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEvent {
    /// When, virtual ms.
    pub at_ms: u64,
    /// What happens.
    pub kind: EventKind,
    /// The node it happens to.
    pub node: String,
    /// The GPU index, for GPU events.
    pub gpu: Option<u32>,
}

/// Everything a run needs besides the scheduler and the seed.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Name shown in reports.
    pub name: String,
    /// The cluster's nodes.
    pub nodes: Vec<Node>,
    /// The queue tree.
    pub queues: Vec<Queue>,
    /// Job instances, by arrival.
    pub jobs: Vec<Job>,
    /// Node and GPU events, by time.
    pub events: Vec<ClusterEvent>,
    /// Run settings.
    pub settings: SimSettings,
    /// What the files said that still works but should change (deprecated
    /// field names), each `FILE:LINE: …`.
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("250ms").unwrap(), 250);
        assert_eq!(parse_duration_ms("30s").unwrap(), 30_000);
        assert_eq!(parse_duration_ms("1h30m").unwrap(), 5_400_000);
        assert_eq!(parse_duration_ms("1.5h").unwrap(), 5_400_000);
        assert_eq!(parse_duration_ms("0").unwrap(), 0);
        assert_eq!(parse_duration_ms("2d").unwrap(), 172_800_000);
        for bad in ["", "5", "5x", "h", "1h-", "s5"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?}");
        }
        assert_eq!(fmt_duration(3_900_000), "1h05m");
        assert_eq!(fmt_duration(42_000), "42s");
    }
}
