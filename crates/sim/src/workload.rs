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

/// A field renamed to the CRD's spelling: the value under the new name,
/// else under the old one (with a warning), and the name it came from;
/// both at once is an error. `field` is the queue's path (`queues[2].`).
fn renamed<'v, T, N>(
    ctx: &Ctx<'_>,
    at: &Spanned<N>,
    field: &str,
    new: (&'v Option<T>, &'static str),
    old: (&'v Option<T>, &'static str),
    warnings: &mut Vec<String>,
) -> Result<(Option<&'v T>, &'static str), LoadError> {
    match (new.0, old.0) {
        (Some(_), Some(_)) => Err(ctx.err(
            at,
            format!("{field}{}", old.1),
            format!("give {} or its old name {}, not both", new.1, old.1),
        )),
        (Some(v), None) => Ok((Some(v), new.1)),
        (None, Some(v)) => {
            warnings.push(format!(
                "{}:{}: {field}{} is deprecated: write {} (the Queue CRD's name)",
                ctx.file,
                at.referenced.line(),
                old.1,
                new.1
            ));
            Ok((Some(v), old.1))
        }
        (None, None) => Ok((None, new.1)),
    }
}

/// Builds errors that point into one file.
pub(crate) struct Ctx<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl Ctx<'_> {
    pub fn err<T>(
        &self,
        at: &Spanned<T>,
        field: impl Into<String>,
        msg: impl Into<String>,
    ) -> LoadError {
        LoadError::at(
            self.file,
            self.text,
            at.referenced.line(),
            at.referenced.column(),
            field,
            msg,
        )
    }

    fn dur(&self, v: &S<String>, field: impl Into<String>) -> Result<u64, LoadError> {
        parse_duration_ms(&v.value).map_err(|e| self.err(v, field, e.to_string()))
    }

    fn opt_dur(&self, v: &Option<S<String>>, field: &str) -> Result<Option<u64>, LoadError> {
        v.as_ref().map(|v| self.dur(v, field)).transpose()
    }

    fn resources(
        &self,
        m: &BTreeMap<String, S<String>>,
        field: &str,
    ) -> Result<ResourceVec, LoadError> {
        use gpusched_model::quantity::{Quantity, parse_bytes, parse_cpu_milli, parse_integer};
        let mut r = ResourceVec::default();
        for (k, v) in m {
            let f = format!("{field}.{k}");
            let e = |x: gpusched_model::QuantityError| self.err(v, &f, x.to_string());
            match k.as_str() {
                "cpu" => r.cpu_milli = parse_cpu_milli(&v.value).map_err(e)?,
                "memory" => r.memory = parse_bytes(&v.value).map_err(e)?,
                "gpu" | "nvidia.com/gpu" => {
                    r.gpu_milli = Quantity::parse(&v.value)
                        .and_then(|q| q.to_milli_u64(&v.value))
                        .map_err(e)?
                }
                other => {
                    r.ext
                        .insert(other.to_string(), parse_integer(&v.value).map_err(e)?);
                }
            }
        }
        Ok(r)
    }

    /// A queue limit: caps exactly the resources the map names, the others
    /// stay unbounded.
    fn limit(
        &self,
        m: &BTreeMap<String, S<String>>,
        field: &str,
    ) -> Result<ResourceLimit, LoadError> {
        let v = self.resources(m, field)?;
        let named: Vec<ResourceKind> = m
            .keys()
            .map(|k| match k.as_str() {
                "gpu" => ResourceKind::Gpu,
                other => ResourceKind::from_resource_name(other),
            })
            .collect();
        Ok(ResourceLimit::named(&v, &named))
    }
}

/// A job's gang: its minimum members, topology and schedule timeout.
type GangShape = (u32, Option<TopologyConstraint>, Option<u64>);

/// A job's first arrival, gap, and run time range `(min, max)` in ms,
/// checked; `f` names a field of the job.
fn job_times(
    ctx: &Ctx<'_>,
    j: &JobSpec,
    f: &dyn Fn(&str) -> String,
) -> Result<(u64, u64, u64, Option<u64>), LoadError> {
    let first = ctx.opt_dur(&j.arrival, &f("arrival"))?.unwrap_or(0);
    let every = ctx.opt_dur(&j.every, &f("every"))?.unwrap_or(0);
    let dmin = ctx.dur(&j.duration, f("duration"))?;
    let dmax = ctx.opt_dur(&j.duration_max, &f("duration_max"))?;
    if let (Some(d), Some(v)) = (dmax, &j.duration_max)
        && d < dmin
    {
        return Err(ctx.err(v, f("duration_max"), "must not be less than `duration`"));
    }
    if dmin == 0 {
        return Err(ctx.err(&j.duration, f("duration"), "must be positive"));
    }
    Ok((first, every, dmin, dmax))
}

/// The pod template every instance of job `j` copies, and its gang;
/// `f` names a field of the job.
fn job_template(
    ctx: &Ctx<'_>,
    j: &JobSpec,
    f: &dyn Fn(&str) -> String,
) -> Result<(Pod, Option<GangShape>), LoadError> {
    // requests: limits = requests (extended resources need limits)
    let mut cr = ContainerResources {
        name: j.name.value.clone(),
        ..Default::default()
    };
    for (k, v) in &j.requests {
        cr.requests.insert(k.clone(), v.value.clone());
        cr.limits.insert(k.clone(), v.value.clone());
    }
    let (requests, gpu) = pod_resources(&[cr]).map_err(|e| {
        // name the first resource the error mentions, else the map
        let (field, at) = j
            .requests
            .iter()
            .find(|(k, _)| e.to_string().contains(&format!("{k:?}")))
            .map(|(k, v)| (f(&format!("requests.{k}")), v))
            .unwrap_or_else(|| (f("requests"), j.requests.values().next().unwrap_or(&j.name)));
        ctx.err(at, field, e.to_string())
    })?;
    let mut template = Pod::new(j.name.value.clone(), j.queue.value.clone());
    template.priority = j.priority;
    template.requests = requests;
    template.gpu = gpu;
    template.gpu_models = j.gpu_models.clone();
    template.min_gpu_memory_mib = match &j.min_gpu_memory {
        Some(v) => gpusched_model::quantity::parse_mib(&v.value)
            .map_err(|e| ctx.err(v, f("min_gpu_memory"), e.to_string()))?,
        None => 0,
    };
    template.node_selector = j.node_selector.clone();
    template.tolerations = j.tolerations.clone();
    template.preemptible = j.preemptible;
    let gang = match &j.gang {
        Some(g) => {
            let mm = g
                .min_member
                .as_ref()
                .map(|m| m.value)
                .unwrap_or(j.pods.value);
            if mm == 0 || mm > j.pods.value {
                let at = g.min_member.as_ref().unwrap_or(&j.pods);
                return Err(ctx.err(
                    at,
                    f("gang.min_member"),
                    format!("must be between 1 and pods ({})", j.pods.value),
                ));
            }
            Some((
                mm,
                g.topology.map(|level| TopologyConstraint {
                    level,
                    required: g.required,
                }),
                ctx.opt_dur(&g.timeout, &f("gang.timeout"))?,
            ))
        }
        None => None,
    };
    Ok((template, gang))
}

/// Salt of the workload's random stream (Poisson gaps, run times) on the
/// run's seed, so it differs from the scheduler's stream of the same seed.
const WORKLOAD_SALT: u64 = 0x5EED_F0A1;

impl WorkloadFile {
    /// Checks the file against the cluster and expands it into a scenario.
    /// Random parts (Poisson gaps, durations in a range) come from `seed`.
    /// Each section is checked and expanded in file order (queues, jobs,
    /// events, settings), so the first error reported is the first in
    /// that order.
    pub(crate) fn expand(
        &self,
        ctx: &Ctx<'_>,
        nodes: Vec<Node>,
        seed: u64,
    ) -> Result<Scenario, LoadError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ WORKLOAD_SALT);
        let mut warnings = Vec::new();
        let (queues, qnames) = self.expand_queues(ctx, &mut warnings)?;
        let jobs = self.expand_jobs(ctx, &qnames, &mut rng)?;
        let events = self.expand_events(ctx, &nodes)?;
        let settings = self.expand_settings(ctx)?;
        Ok(Scenario {
            name: self.name.clone().unwrap_or_else(|| ctx.file.to_string()),
            nodes,
            queues,
            jobs,
            events,
            settings,
            warnings,
        })
    }

    /// `queues`: the queue tree and the set of its names (every parent
    /// checked against it); deprecated spellings add to `warnings`.
    fn expand_queues(
        &self,
        ctx: &Ctx<'_>,
        warnings: &mut Vec<String>,
    ) -> Result<(Vec<Queue>, BTreeSet<String>), LoadError> {
        let mut queues = Vec::new();
        let mut qnames = BTreeSet::new();
        for (i, q) in self.queues.iter().enumerate() {
            let f = |x: &str| format!("queues[{i}].{x}");
            if q.name.value.is_empty() {
                return Err(ctx.err(&q.name, f("name"), "must not be empty"));
            }
            if !qnames.insert(q.name.value.clone()) {
                return Err(ctx.err(
                    &q.name,
                    f("name"),
                    format!("duplicate queue {:?}", q.name.value),
                ));
            }
            if q.weight.value == 0 {
                return Err(ctx.err(&q.weight, f("weight"), "must be at least 1"));
            }
            let mut queue = Queue::new(q.name.value.clone());
            queue.weight = q.weight.value;
            // one spelling per concept, the CRD's; the old one still reads
            let (guaranteed, g_field) = renamed(
                ctx,
                &q.name,
                &f(""),
                (&q.guaranteed, "guaranteed"),
                (&q.guarantee, "guarantee"),
                warnings,
            )?;
            if let Some(m) = guaranteed {
                queue.guarantee = ctx.resources(m, &f(g_field))?;
            }
            let (by_model, m_field) = renamed(
                ctx,
                &q.name,
                &f(""),
                (&q.guaranteed_gpus_by_model, "guaranteed_gpus_by_model"),
                (&q.gpu_guarantee_by_model, "gpu_guarantee_by_model"),
                warnings,
            )?;
            for (m, v) in by_model.into_iter().flatten() {
                let g = gpusched_model::Quantity::parse(&v.value)
                    .and_then(|x| x.to_milli_u64(&v.value))
                    .map_err(|e| ctx.err(v, f(&format!("{m_field}.{m}")), e.to_string()))?;
                queue.gpu_guarantee_by_model.insert(m.clone(), g);
            }
            queue.limit = q
                .limit
                .as_ref()
                .map(|l| ctx.limit(l, &f("limit")))
                .transpose()?;
            let (borrow, _) = renamed(
                ctx,
                &q.name,
                &f(""),
                (&q.borrow, "borrow"),
                (&q.can_borrow, "can_borrow"),
                warnings,
            )?;
            queue.can_borrow = borrow.copied().unwrap_or(true);
            queue.reclaimable = q.reclaimable;
            queue.min_runtime_ms = ctx.opt_dur(&q.min_runtime, &f("min_runtime"))?;
            queue.parent = q.parent.as_ref().map(|p| p.value.clone());
            queues.push(queue);
        }
        for (i, q) in self.queues.iter().enumerate() {
            if let Some(p) = &q.parent
                && !qnames.contains(&p.value)
            {
                return Err(ctx.err(
                    p,
                    format!("queues[{i}].parent"),
                    format!("unknown queue {:?}", p.value),
                ));
            }
        }
        Ok((queues, qnames))
    }

    /// `jobs`: every instance of every job kind, by arrival (ties: file
    /// order), on queues of `qnames`.
    fn expand_jobs(
        &self,
        ctx: &Ctx<'_>,
        qnames: &BTreeSet<String>,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Job>, LoadError> {
        let mut jobs = Vec::new();
        let mut kinds = BTreeSet::new();
        for (i, j) in self.jobs.iter().enumerate() {
            let f = |x: &str| format!("jobs[{i}].{x}");
            if j.name.value.is_empty() {
                return Err(ctx.err(&j.name, f("name"), "must not be empty"));
            }
            if !kinds.insert(j.name.value.clone()) {
                return Err(ctx.err(
                    &j.name,
                    f("name"),
                    format!("duplicate job name {:?}", j.name.value),
                ));
            }
            if !qnames.contains(&j.queue.value) {
                return Err(ctx.err(
                    &j.queue,
                    f("queue"),
                    format!(
                        "unknown queue {:?} (declare it under `queues`)",
                        j.queue.value
                    ),
                ));
            }
            if j.pods.value == 0 {
                return Err(ctx.err(&j.pods, f("pods"), "must be at least 1"));
            }
            let (first, every, dmin, dmax) = job_times(ctx, j, &f)?;
            let (template, gang) = job_template(ctx, j, &f)?;
            let mut t = first;
            for n in 0..j.count.value {
                if n > 0 {
                    t += if j.poisson && every > 0 {
                        let u: f64 = rng.random_range(0.0..1.0);
                        (-(1.0 - u).ln() * every as f64).round() as u64
                    } else {
                        every
                    };
                }
                let duration_ms = match dmax {
                    Some(d) if d > dmin => rng.random_range(dmin..=d),
                    _ => dmin,
                };
                let name = if j.count.value == 1 {
                    j.name.value.clone()
                } else {
                    format!("{}-{n}", j.name.value)
                };
                let mut tp = template.clone();
                tp.name = name.clone();
                tp.labels = j.labels.clone();
                tp.labels.insert(LABEL_SIM_JOB.into(), name.clone());
                if let Some(c) = &j.constraints
                    && !c.is_empty()
                {
                    tp.constraints = Some(Box::new(for_instance(c, &name)));
                }
                tp.arrival_ms = t;
                let group = gang.map(|(min_member, topology, timeout)| {
                    tp.group = Some(name.clone());
                    PodGroup {
                        name: name.clone(),
                        queue: j.queue.value.clone(),
                        min_member,
                        priority: j.priority,
                        topology,
                        schedule_timeout_ms: timeout,
                    }
                });
                jobs.push(Job {
                    name,
                    kind: j.name.value.clone(),
                    queue: j.queue.value.clone(),
                    arrival_ms: t,
                    duration_ms,
                    pods: j.pods.value,
                    template: tp,
                    group,
                });
            }
        }
        // stable order by arrival (ties: file order)
        jobs.sort_by_key(|j| j.arrival_ms);
        Ok(jobs)
    }

    /// `events`: the cluster events on `nodes`, a recovery added for each
    /// `recover_after`, by time.
    fn expand_events(&self, ctx: &Ctx<'_>, nodes: &[Node]) -> Result<Vec<ClusterEvent>, LoadError> {
        let node_names: BTreeMap<&str, &Node> =
            nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let mut events = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            let f = |x: &str| format!("events[{i}].{x}");
            let at_ms = ctx.dur(&e.at, f("at"))?;
            let Some(node) = node_names.get(e.node.value.as_str()) else {
                return Err(ctx.err(
                    &e.node,
                    f("node"),
                    format!("unknown node {:?} (not in the cluster)", e.node.value),
                ));
            };
            let needs_gpu = matches!(e.kind, EventKind::GpuFailure | EventKind::GpuRecovery);
            let gpu = match (&e.gpu, needs_gpu) {
                (Some(g), true) => {
                    if g.value as usize >= node.gpus.len() {
                        return Err(ctx.err(
                            g,
                            f("gpu"),
                            format!(
                                "node {:?} has {} GPUs (positions 0..{})",
                                node.name,
                                node.gpus.len(),
                                node.gpus.len()
                            ),
                        ));
                    }
                    Some(g.value)
                }
                (None, true) => {
                    return Err(ctx.err(&e.node, f("gpu"), "required for gpu events"));
                }
                (Some(g), false) => {
                    return Err(ctx.err(g, f("gpu"), "only gpu events take a gpu"));
                }
                (None, false) => None,
            };
            events.push(ClusterEvent {
                at_ms,
                kind: e.kind,
                node: e.node.value.clone(),
                gpu,
            });
            if let Some(r) = &e.recover_after {
                let d = ctx.dur(r, f("recover_after"))?;
                let kind = match e.kind {
                    EventKind::NodeFailure => EventKind::NodeRecovery,
                    EventKind::GpuFailure => EventKind::GpuRecovery,
                    EventKind::Drain => EventKind::Uncordon,
                    _ => {
                        return Err(ctx.err(
                            r,
                            f("recover_after"),
                            "only node-failure, gpu-failure and drain take recover_after",
                        ));
                    }
                };
                events.push(ClusterEvent {
                    at_ms: at_ms + d,
                    kind,
                    node: e.node.value.clone(),
                    gpu,
                });
            }
        }
        events.sort_by_key(|e| e.at_ms);

        Ok(events)
    }

    /// `settings`: the defaults with what the file sets.
    fn expand_settings(&self, ctx: &Ctx<'_>) -> Result<SimSettings, LoadError> {
        let mut settings = SimSettings::default();
        if let Some(s) = &self.settings {
            if let Some(v) = ctx.opt_dur(&s.cycle_interval, "settings.cycle_interval")? {
                settings.cycle_interval_ms = v;
            }
            if let Some(t) = &s.tick {
                let v = ctx.dur(t, "settings.tick")?;
                if v == 0 {
                    return Err(ctx.err(t, "settings.tick", "must be positive"));
                }
                settings.tick_ms = v;
            }
            if let Some(v) = s.retry_limit {
                settings.retry_limit = v;
            }
            if let Some(v) = ctx.opt_dur(&s.backoff, "settings.backoff")? {
                settings.backoff_ms = v;
            }
            if let Some(v) = ctx.opt_dur(&s.backoff_max, "settings.backoff_max")? {
                settings.backoff_max_ms = v;
            }
            settings.until_ms = ctx.opt_dur(&s.until, "settings.until")?;
            if let Some(v) = ctx.opt_dur(&s.idle_stop, "settings.idle_stop")? {
                settings.idle_stop_ms = v;
            }
            if let Some(v) = ctx.opt_dur(&s.termination_grace, "settings.termination_grace")? {
                settings.termination_grace_ms = v;
            }
        }
        Ok(settings)
    }
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
