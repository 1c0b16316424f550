//! The FGD evaluation method (DESIGN.md §5): the method behind the
//! published numbers of Weng et al., USENIX ATC '23.
//!
//! For each seed:
//! 1. the workload is every pod of the trace plus pods drawn with
//!    replacement from it (ChaCha8 seeded with the seed) until the next
//!    draw would push the total GPU request past `tune_ratio` (1.3) × the
//!    cluster's GPU capacity; a trace asking for more has random pods
//!    removed until it fits;
//! 2. the workload is shuffled (same RNG);
//! 3. every pod is scheduled once, in that order, with no departures: the
//!    standard filters (CPU, memory, GPU model from `pod.gpu_models`), then
//!    the packer scores every feasible node and the best score wins; ties
//!    are broken uniformly at random (as kube-scheduler's `selectHost`) or
//!    by the lowest node id ([`TieBreak`]); a pod that fits nowhere is
//!    skipped;
//! 4. after every pod, `alloc = used GPU milli / capacity` and
//!    `arrived = GPU milli of the pods seen so far / capacity` are recorded.
//!
//! Curves are discretised as the reference analysis does: the value at
//! arrived `x` % is the mean alloc % of the records whose arrived % rounds
//! (half to even) to `x` (if none, those within `x ± 1`). The headline is the
//! value at 100 %.
//!
//! Each decision calls the packer's `prepare` with a fresh seed derived from
//! the run's seed and the pod's position, against a snapshot that holds the
//! pods placed so far, so every policy sees exactly the current cluster.

use super::common::{MethodResult, SeedRun};
use gpusched_core::{
    ClusterState, NodeId, PackEnv, Packer, PodPhase, PodState, SchedulingKey, Snapshot,
};
use gpusched_model::{GPU_MILLI, GpuRequest, Node, Pod};
use gpusched_plugins::packing::fgd::FragEngine;
use gpusched_plugins::packing::gpusched::GpuschedConfig;
use gpusched_plugins::packing::profile::TYPICAL_COVERAGE;
use gpusched_plugins::packing::{self, PackerOptions, Profile, UnknownPolicy};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

mod published;
pub use published::{parse_published, published_policy_name};

/// Highest arrived percentage on the curves.
pub const MAX_ARRIVED_PCT: usize = 130;

/// How equal scores are split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TieBreak {
    /// The first node in a seeded random permutation of the node list (the
    /// reference prefixes node names with a random permutation, and its
    /// published numbers behave like a fixed order among equal scores).
    #[default]
    Permuted,
    /// Uniformly at random among the best, per decision (upstream
    /// kube-scheduler's `selectHost`).
    Random,
    /// The lowest node id (the gpusched core's rule).
    LowestId,
}

/// Settings of one evaluation.
#[derive(Clone, Debug)]
pub struct FgdMethod {
    /// Target total GPU request as a multiple of capacity.
    pub tune_ratio: f64,
    /// How equal scores are split.
    pub tie_break: TieBreak,
    /// Target workload (pod-class distribution) of the fragmentation-aware
    /// policies and of the fragmentation metric (which, like `fgd`, uses its
    /// typical pods); `None`: the trace's class distribution.
    pub profile: Option<Profile>,
    /// Worker threads for the seeds (0: available parallelism).
    pub threads: usize,
    /// Consolidation moves allowed per 100 pods placed (0: off); see
    /// [`super::consolidate_method`].
    pub move_budget: u32,
    /// Knobs of the `gpusched` policy (experiments); `None`: its defaults.
    pub gpusched: Option<GpuschedConfig>,
}

impl Default for FgdMethod {
    fn default() -> Self {
        FgdMethod {
            tune_ratio: 1.3,
            tie_break: TieBreak::Permuted,
            profile: None,
            threads: 0,
            move_budget: 0,
            gpusched: None,
        }
    }
}

/// Salt of the tie-break stream (node permutation, random ties) on the
/// run's seed, apart from the sampling and shuffling stream of
/// [`workload`] (ASCII `tiebreak`).
const TIE_BREAK_SALT: u64 = 0x7469_6562_7265_616b;

/// Why an evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum MethodError {
    /// The policy name is unknown.
    #[error(transparent)]
    Policy(#[from] UnknownPolicy),
    /// No node has a GPU.
    #[error("the cluster has no usable GPU")]
    NoGpus,
    /// No pod to place.
    #[error("the pod list is empty")]
    NoPods,
    /// The cluster state refused a placement the policy chose (a bug).
    #[error("seed {seed}: placement of pod {pod:?} on node {node} refused: {reason}")]
    Refused {
        /// The seed of the run.
        seed: u64,
        /// The pod.
        pod: String,
        /// The node chosen.
        node: String,
        /// Why it was refused.
        reason: String,
    },
}

/// The GPU milli a pod asks for (a share counts its compute milli).
pub fn demand_milli(p: &Pod) -> u64 {
    p.gpu.milli()
}

/// The workload of one seed: trace pods plus draws, shuffled (indices into
/// `trace`).
pub fn workload(trace: &[Pod], capacity_milli: u64, tune_ratio: f64, seed: u64) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let target = tune_ratio * capacity_milli as f64;
    let mut idx: Vec<usize> = (0..trace.len()).collect();
    let mut total: u64 = trace.iter().map(demand_milli).sum();
    if (total as f64) < target && !trace.is_empty() {
        loop {
            let i = rng.random_range(0..trace.len());
            let d = demand_milli(&trace[i]);
            if (total + d) as f64 > target {
                break;
            }
            total += d;
            idx.push(i);
        }
    } else {
        while (total as f64) > target && !idx.is_empty() {
            let k = rng.random_range(0..idx.len());
            total -= demand_milli(&trace[idx[k]]);
            idx.remove(k);
        }
    }
    idx.shuffle(&mut rng);
    idx
}

/// Runs the method for one policy over `seeds` (in parallel, results in
/// seed order).
pub fn run(
    method: &FgdMethod,
    nodes: &[Node],
    trace: &[Pod],
    policy: &str,
    seeds: &[u64],
) -> Result<MethodResult, MethodError> {
    // fail early on a bad name
    packing::by_name(policy, &PackerOptions::default())?;
    if trace.is_empty() {
        return Err(MethodError::NoPods);
    }
    let total_gpus: u64 = nodes
        .iter()
        .map(|n| n.gpus.iter().filter(|g| g.is_healthy()).count() as u64)
        .sum();
    if total_gpus == 0 {
        return Err(MethodError::NoGpus);
    }
    let profile = method
        .profile
        .clone()
        .unwrap_or_else(|| Profile::from_pods(trace.iter()));
    let threads = if method.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        method.threads
    }
    .clamp(1, seeds.len().max(1));
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<Result<SeedRun, MethodError>>>> =
        Mutex::new((0..seeds.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= seeds.len() {
                        break;
                    }
                    let r = run_seed(method, nodes, trace, policy, &profile, seeds[i]);
                    if let Ok(mut o) = out.lock() {
                        o[i] = Some(r);
                    }
                }
            });
        }
    });
    let mut runs = Vec::with_capacity(seeds.len());
    for r in out.into_inner().unwrap_or_default().into_iter().flatten() {
        runs.push(r?);
    }
    Ok(MethodResult {
        policy: policy.to_string(),
        total_gpus,
        runs,
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round_ties_even() / 100.0
}

/// Whether the node's free GPUs could hold the request (a cheap pre-check;
/// the packer decides exactly).
fn gpu_precheck(cs: &ClusterState<'_>, pod: &Pod, n: NodeId) -> bool {
    let st = cs.get(n);
    match pod.gpu {
        GpuRequest::None | GpuRequest::Whole(0) => true,
        GpuRequest::Whole(k) => st.free.gpu_milli >= k as u64 * GPU_MILLI && st.whole_free() >= k,
        GpuRequest::Share { milli, .. } => {
            st.free.gpu_milli >= milli as u64 && st.gpu_free_milli.iter().any(|&f| f >= milli)
        }
    }
}

/// Whether the filters pass `pod` on node `n` and its free GPUs could hold
/// the request (the packer decides exactly).
fn candidate(cs: &ClusterState<'_>, pod: &Pod, n: NodeId) -> bool {
    let node = cs.node(n);
    !node.unschedulable
        && model_ok(pod, node)
        && cs.fits_non_gpu(pod, n)
        && gpu_precheck(cs, pod, n)
}

fn model_ok(pod: &Pod, node: &Node) -> bool {
    if pod.gpu.is_none() || pod.gpu_models.is_empty() {
        return true;
    }
    node.gpus.iter().any(|g| pod.allows_model(&g.model))
}

/// Dense ids of the trace's pod classes: pods with equal scheduling keys
/// (what the core keys its own cache on, plus what the packer declares)
/// get one id. Returns the id of each pod and the number of ids.
fn pod_classes(trace: &[Pod], packer: &dyn Packer) -> (Vec<u32>, usize) {
    let mut ids: BTreeMap<SchedulingKey, u32> = BTreeMap::new();
    let of = trace
        .iter()
        .map(|pod| {
            let mut key = SchedulingKey::new();
            key.add(&pod.requests);
            key.add(&pod.gpu);
            key.add(&pod.gpu_models);
            key.add(&pod.min_gpu_memory_mib);
            packer.scheduling_key(pod, &mut key);
            let next = ids.len() as u32;
            *ids.entry(key).or_insert(next)
        })
        .collect();
    (of, ids.len())
}

/// What a cached result was computed under, besides the node's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Generation {
    /// The packer's [`Packer::generation`].
    Packer(u64),
    /// One decision only (the packer promises nothing across decisions).
    Decision(usize),
}

/// A node's candidacy for each pod class: the filters' verdict and the
/// score of the packer's `place`, kept while the node's version and the
/// packer's generation stay. Between two placements on a node the cluster
/// sees hundreds of decisions, most for classes seen before, so most
/// decisions read every node from here instead of scoring it again. The
/// scores are the ones `place` would give now, so runs are the same with
/// and without it; the winner's GPUs come from one more `place` call.
struct PlaceCache {
    nodes: usize,
    /// Per node: the version and generation its current epoch holds for,
    /// and that epoch (from 1).
    stamp: Vec<(u64, Generation, u32)>,
    /// Per class and node (class-major: a decision reads one class for
    /// every node, in node order): the epoch it was computed in (0: never)
    /// and the score (`None`: not a candidate).
    entries: Vec<(u32, Option<gpusched_core::Score>)>,
}

/// Most entries a [`PlaceCache`] holds (32 bytes each): a larger cluster
/// times class count runs without one.
const PLACE_CACHE_ENTRIES: usize = 1 << 21;

impl PlaceCache {
    fn new(nodes: usize, classes: usize) -> Self {
        let size = nodes.saturating_mul(classes);
        PlaceCache {
            nodes,
            stamp: vec![(u64::MAX, Generation::Decision(usize::MAX), 0); nodes],
            entries: if size <= PLACE_CACHE_ENTRIES {
                vec![(0, None); size]
            } else {
                Vec::new()
            },
        }
    }

    /// Node `n`'s score for `class`, computed by `compute` unless held for
    /// this version and generation.
    fn get(
        &mut self,
        n: NodeId,
        class: u32,
        version: u64,
        generation: Generation,
        compute: impl FnOnce() -> Option<gpusched_core::Score>,
    ) -> Option<gpusched_core::Score> {
        if self.entries.is_empty() {
            return compute();
        }
        let stamp = &mut self.stamp[n as usize];
        if (stamp.0, stamp.1) != (version, generation) {
            *stamp = (version, generation, stamp.2 + 1);
        }
        let epoch = stamp.2;
        let entry = &mut self.entries[class as usize * self.nodes + n as usize];
        if entry.0 != epoch {
            *entry = (epoch, compute());
        }
        entry.1
    }
}

/// One seed of one policy.
pub fn run_seed(
    method: &FgdMethod,
    nodes: &[Node],
    trace: &[Pod],
    policy: &str,
    profile: &Profile,
    seed: u64,
) -> Result<SeedRun, MethodError> {
    let mut packer = packing::by_name(
        policy,
        &PackerOptions {
            profile: Some(profile.clone()),
            gpusched: method.gpusched,
        },
    )?;
    run_seed_with(method, nodes, trace, &mut *packer, profile, seed)
}

/// One seed with the packer given (built by [`run_seed`] from its name).
fn run_seed_with(
    method: &FgdMethod,
    nodes: &[Node],
    trace: &[Pod],
    packer: &mut dyn Packer,
    profile: &Profile,
    seed: u64,
) -> Result<SeedRun, MethodError> {
    let frag = FragEngine::new(profile.typical(TYPICAL_COVERAGE));
    let mut cs = ClusterState::new(nodes);
    let (capacity, _) = cs.gpu_milli_totals();
    let order = workload(trace, capacity, method.tune_ratio, seed);
    let requested: u64 = order.iter().map(|&i| demand_milli(&trace[i])).sum();
    let mut snap = Snapshot {
        nodes: nodes.to_vec(),
        ..Default::default()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ TIE_BREAK_SALT);
    // priority of each node among equal scores (lower first)
    let prio: Vec<u32> = match method.tie_break {
        TieBreak::Permuted => {
            let mut p: Vec<u32> = (0..nodes.len() as u32).collect();
            p.shuffle(&mut rng);
            p
        }
        _ => (0..nodes.len() as u32).collect(),
    };
    let buckets = MAX_ARRIVED_PCT + 1;
    let mut sum = vec![0.0f64; buckets + 2];
    let mut cnt = vec![0u32; buckets + 2];
    let mut frag_curve: Vec<Option<f64>> = vec![None; buckets];
    let mut arrived: u64 = 0;
    let mut used: u64 = 0;
    let (mut placed, mut skipped) = (0usize, 0usize);
    let cap = capacity as f64;
    let mut mover = super::consolidate_method::Mover::new(method.move_budget, nodes.len());
    let (class_of, classes) = pod_classes(trace, packer);
    let mut cache = PlaceCache::new(nodes.len(), classes);
    for (step, &ti) in order.iter().enumerate() {
        let pod = &trace[ti];
        arrived += demand_milli(pod);
        packer.prepare(&PackEnv {
            snapshot: &snap,
            state: &cs,
            seed: gpusched_model::mix::mix_indexed(seed, step as u64),
            pods_changed: None,
        });
        // a packer that promises nothing across decisions gets a generation
        // of its own for each one
        let generation = packer
            .generation()
            .map_or(Generation::Decision(step), Generation::Packer);
        let class = class_of[ti];
        let mut best: Option<(NodeId, gpusched_core::Score)> = None;
        let mut ties = 0u32;
        for n in 0..nodes.len() as NodeId {
            let Some(score) = cache.get(n, class, cs.get(n).version, generation, || {
                candidate(&cs, pod, n)
                    .then(|| packer.place(pod, n, &cs))?
                    .map(|pl| pl.score)
            }) else {
                continue;
            };
            match &best {
                Some((_, b)) if score < *b => {}
                Some((bn, b)) if score == *b => {
                    ties += 1;
                    let take = match method.tie_break {
                        TieBreak::Random => rng.random_range(0..ties) == 0,
                        _ => prio[n as usize] < prio[*bn as usize],
                    };
                    if take {
                        best = Some((n, score));
                    }
                }
                _ => {
                    ties = 1;
                    best = Some((n, score));
                }
            }
        }
        // the winner's GPUs: the same call on the same state and generation
        // as the score kept
        let best = best.and_then(|(n, _)| Some((n, packer.place(pod, n, &cs)?)));
        match best {
            Some((n, pl)) => {
                cs.assign(n, &pod.requests, &pl.gpus)
                    .map_err(|e| MethodError::Refused {
                        seed,
                        pod: pod.name.clone(),
                        node: nodes[n as usize].name.clone(),
                        reason: e.to_string(),
                    })?;
                used += pl.gpus.milli();
                placed += 1;
                snap.pods.push(PodState {
                    pod: pod.clone().into(),
                    phase: PodPhase::Running {
                        node: n,
                        gpus: pl.gpus,
                        since_ms: 0,
                    },
                });
                mover.placed(n, snap.pods.len() - 1);
            }
            None => match mover.try_place(pod, &mut cs, &mut snap, &*packer, placed) {
                Some(milli) => {
                    used += milli;
                    placed += 1;
                }
                None => skipped += 1,
            },
        }
        let arrived_pct = (arrived as f64 / cap * 100.0).round_ties_even();
        let alloc_pct = round2(used as f64 / cap * 100.0);
        if arrived_pct >= 0.0 && (arrived_pct as usize) < buckets {
            let b = arrived_pct as usize;
            sum[b] += alloc_pct;
            cnt[b] += 1;
            if frag_curve[b].is_none() {
                frag_curve[b] = Some(frag.cluster_frag(&cs) / cap * 100.0);
            }
        }
    }
    let alloc_curve: Vec<Option<f64>> = (0..buckets)
        .map(|x| {
            if cnt[x] > 0 {
                return Some(round2(sum[x] / cnt[x] as f64));
            }
            let lo = x.saturating_sub(1);
            let hi = (x + 1).min(buckets - 1);
            let (s, c) = (lo..=hi).fold((0.0, 0u32), |(s, c), i| (s + sum[i], c + cnt[i]));
            (c > 0).then(|| round2(s / c as f64))
        })
        .collect();
    let final_alloc = used as f64 / cap * 100.0;
    Ok(SeedRun {
        seed,
        pods: order.len(),
        placed,
        skipped,
        requested_pct: requested as f64 / cap * 100.0,
        alloc_at_100: alloc_curve[100].unwrap_or(final_alloc),
        alloc_curve,
        frag_curve,
        final_alloc,
        moves: mover.moves,
    })
}

#[cfg(test)]
mod tests;
