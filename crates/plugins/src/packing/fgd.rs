//! `fgd`: fragmentation gradient descent (Weng et al., "Beware of
//! Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
//! Gradient Descent", USENIX ATC '23), re-implemented from the paper and
//! its public simulator.
//!
//! **Node fragmentation** against a target workload `M` (pod classes `c`
//! with weights `p_c`, see [`Profile`]): with `T` the node's free GPU milli
//! (sum over its GPUs),
//!
//! ```text
//! F(n) = Σ_c p_c · f_c(n)
//! f_c(n) = Σ_{g: free_g < m_c} free_g   if c is a GPU class, the node's model
//!                                        is allowed, the node has ≥ k_c GPUs
//!                                        with free_g ≥ m_c and CPU for c
//!        = T                             otherwise (c cannot run here, or c
//!                                        needs no GPU: every idle GPU milli is
//!                                        fragment from its point of view)
//! ```
//!
//! where `m_c` is the milli-GPU per GPU and `k_c` the GPU count of `c`.
//! Placing a pod changes `F` by `Δ = F(before) − F(after)`; FGD puts the
//! pod on the node and GPU with the largest `Δ` (the smallest increase of
//! fragmentation). As in the reference the score is
//! `⌊100 · sigmoid(Δ / 1000)⌋`, an integer in 0..=100, and a share goes on
//! the first GPU (position order) with the best score. Whole GPUs take the
//! topology choice (fragmentation does not depend on which free GPUs).
//! Memory is not part of fragmentation.
//!
//! The fragmentation of a node depends only on (model, free CPU, multiset of
//! free GPU milli), so [`FragEngine`] memoises `F` and the per-class `Δ` by
//! that signature; a thousand nodes in a few hundred states cost a few
//! hundred evaluations, not a thousand.

use super::profile::{PodClass, Profile, TYPICAL_COVERAGE};
use super::util::{FxMap, WholeChooser, for_each_share, node_model, share_on};
use gpusched_core::state::share_milli;
use gpusched_core::{ClusterState, NodeId, PackEnv, Packer, Placement};
use gpusched_model::{GPU_MILLI, GpuRequest, Pod};
use std::sync::Mutex;

/// Largest node (in GPUs) whose states are memoised.
const SIG_GPUS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Sig {
    model: u32,
    gpu_mem: u32,
    cpu: u64,
    n: u8,
    /// Free milli per GPU, sorted descending, zero-padded.
    lefts: [u16; SIG_GPUS],
}

impl Sig {
    fn lefts(&self) -> &[u16] {
        &self.lefts[..self.n as usize]
    }
    fn sort(&mut self) {
        let n = self.n as usize;
        self.lefts[..n].sort_unstable_by(|a, b| b.cmp(a));
    }
}

/// The outcome of placing one pod class on one node state: `Δ` per
/// distinct free-milli value of the GPU a share would go on (whole GPUs and
/// CPU-only pods have one entry with value 0).
#[derive(Clone, Debug, Default)]
pub(crate) struct Eval {
    pub(crate) deltas: Vec<(u16, f64)>,
    /// `⌊100 · sigmoid(Δ / scale)⌋` of each entry (scale of the engine;
    /// rounded up instead for a CPU-only pod of an engine
    /// [`FragEngine::with_cpu_only_round_up`]).
    pub(crate) squashed: Vec<i64>,
    /// A mixed engine's `Δ` per part, entry after entry (empty otherwise).
    parts: Vec<f64>,
    /// The mix `deltas` were combined with (see [`FragEngine::set_mix`]).
    epoch: u64,
}

impl Eval {
    fn new(deltas: Vec<(u16, f64)>, scale: f64, up: bool) -> Eval {
        let squashed = deltas
            .iter()
            .map(|(_, d)| squash(d * 1000.0 / scale, up))
            .collect();
        Eval {
            deltas,
            squashed,
            parts: Vec::new(),
            epoch: 0,
        }
    }

    /// `(Δ, squashed)` for a GPU with `left` milli free.
    pub(crate) fn for_left(&self, left: u32) -> Option<(f64, i64)> {
        self.deltas
            .iter()
            .position(|(l, _)| *l as u32 == left)
            .map(|i| (self.deltas[i].1, self.squashed[i]))
    }

    /// `(Δ, squashed)` of a whole-GPU or CPU-only request.
    pub(crate) fn first(&self) -> Option<(f64, i64)> {
        self.deltas.first().map(|d| (d.1, self.squashed[0]))
    }
}

#[derive(Default)]
struct Memo {
    model_ids: FxMap<String, u32>,
    model_names: Vec<String>,
    /// Per model id: is profile class i allowed there?
    allowed: Vec<Vec<bool>>,
    /// Per model id: is class group i allowed there? (grouped engines)
    allowed_groups: Vec<Vec<bool>>,
    frag: FxMap<Sig, f64>,
    /// `F` per part of a mixed engine (kept when the mix changes).
    parts: FxMap<Sig, Box<[f64]>>,
    /// Bumped by every new mix: evaluations of an older one are
    /// recombined from their parts when next read.
    epoch: u64,
    eval: FxMap<(Sig, u32), Eval>,
    pod_class_ids: FxMap<PodClass, u32>,
    last_pod: Option<(u64, GpuRequest, Vec<String>, u32)>,
    node_model: Vec<u32>,
}

/// Classes of one GPU shape and model set, sorted by CPU request, for the
/// grouped evaluation: `F` needs, per shape, only the weight of the classes
/// whose CPU fits the node (a binary search) instead of a pass over every
/// class.
#[derive(Clone, Debug)]
struct Group {
    gpu_milli: u32,
    gpu_mem_mib: u64,
    gpu_count: u32,
    gpu_models: Vec<String>,
    /// CPU requests, ascending.
    cpus: Vec<u64>,
    /// `cum[i]`: weight of the classes `cpus[..i]`.
    cum: Vec<f64>,
    /// The part of a mixed engine the group belongs to (0 otherwise).
    part: usize,
}

impl Group {
    fn total(&self) -> f64 {
        self.cum.last().copied().unwrap_or(0.0)
    }

    /// Weight of the classes asking at most `cpu`.
    fn fitting(&self, cpu: u64) -> f64 {
        self.cum[self.cpus.partition_point(|&c| c <= cpu)]
    }
}

/// Over a node's free GPU milli `lefts`: how many GPUs have at least `m`
/// free, and the free milli of those that do not (FGD's stranded part).
#[inline]
fn fit_and_short(lefts: &[u16], m: u64) -> (u32, u64) {
    let mut fit = 0u32;
    let mut short = 0u64;
    for &l in lefts {
        if l as u64 >= m {
            fit += 1;
        } else {
            short += l as u64;
        }
    }
    (fit, short)
}

/// The profile's GPU classes grouped by shape (and the CPU-only weight),
/// the groups tagged with `part`.
fn group_classes(profile: &Profile, part: usize) -> (Vec<Group>, f64) {
    let mut cpu_only = 0.0;
    type Shape = (u32, u64, u32, Vec<String>);
    let mut map: std::collections::BTreeMap<Shape, Vec<(u64, f64)>> =
        std::collections::BTreeMap::new();
    for (c, w) in profile.classes() {
        if c.gpu_count == 0 {
            cpu_only += w;
            continue;
        }
        map.entry((
            c.gpu_milli,
            c.gpu_mem_mib,
            c.gpu_count,
            c.gpu_models.clone(),
        ))
        .or_default()
        .push((c.cpu_milli, *w));
    }
    let groups = map
        .into_iter()
        .map(|((gpu_milli, gpu_mem_mib, gpu_count, gpu_models), mut v)| {
            v.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
            let mut cum = Vec::with_capacity(v.len() + 1);
            cum.push(0.0);
            let mut acc = 0.0;
            for (_, w) in &v {
                acc += w;
                cum.push(acc);
            }
            Group {
                gpu_milli,
                gpu_mem_mib,
                gpu_count,
                gpu_models,
                cpus: v.into_iter().map(|x| x.0).collect(),
                cum,
                part,
            }
        })
        .collect();
    (groups, cpu_only)
}

/// `Σ_k v_k · c_k`: a mixed engine's `F` or `Δ` from its parts.
fn dot(v: &[f64], c: &[f64]) -> f64 {
    v.iter().zip(c).map(|(v, c)| v * c).sum()
}

/// Class groups of a grouped engine.
#[derive(Clone, Debug)]
struct Grouped {
    groups: Vec<Group>,
    /// Weight of the CPU-only classes, per part.
    cpu_only: Vec<f64>,
    /// Coefficient of each part in `F` (one part of coefficient 1 unless
    /// the engine is mixed).
    coef: Vec<f64>,
}

/// Fragmentation of nodes against a profile, with memoised evaluation.
pub struct FragEngine {
    profile: Profile,
    scale: f64,
    memo: Mutex<Memo>,
    /// Grouped evaluation (same `F` up to floating-point summation order).
    groups: Option<Grouped>,
    /// Exponent `a` of the pod's GPU demand in the squash scale
    /// (`scale · gᵃ`); 0: one scale for every pod.
    size_exponent: f64,
    /// Round a CPU-only pod's squashed score up instead of down.
    cpu_only_round_up: bool,
}

impl FragEngine {
    /// An engine against `profile` with the reference squash scale (1000).
    pub fn new(profile: Profile) -> Self {
        Self::with_scale(profile, 1000.0)
    }

    /// An engine whose evaluations also carry `⌊100·sigmoid(Δ/scale)⌋`.
    pub fn with_scale(profile: Profile, scale: f64) -> Self {
        FragEngine {
            profile,
            scale: if scale > 0.0 { scale } else { 1000.0 },
            memo: Mutex::new(Memo::default()),
            groups: None,
            size_exponent: 0.0,
            cpu_only_round_up: false,
        }
    }

    /// As [`FragEngine::with_scale`], evaluating `F` by class groups (one
    /// per GPU shape and model set, CPU by binary search): the same value up
    /// to the order of floating-point additions, and much faster on a
    /// profile with many CPU sizes per shape.
    pub fn grouped(profile: Profile, scale: f64) -> Self {
        Self::mixed(std::slice::from_ref(&profile), &[1.0], scale)
    }

    /// A grouped engine whose target workload is a linear mix of `parts`:
    /// `F = Σ_k coef_k · F_k`, `F_k` the fragmentation against part `k`
    /// with the weights as given (not normalised). `F_k` is memoised per
    /// node state and part, so [`FragEngine::set_mix`] changes the
    /// coefficients without evaluating a state again. Missing coefficients
    /// are 0. [`FragEngine::profile`] lists every part's classes.
    pub fn mixed(parts: &[Profile], coef: &[f64], scale: f64) -> Self {
        let mut groups = Vec::new();
        let mut cpu_only = Vec::with_capacity(parts.len());
        for (k, p) in parts.iter().enumerate() {
            let (g, c) = group_classes(p, k);
            groups.extend(g);
            cpu_only.push(c);
        }
        let coef = (0..parts.len())
            .map(|k| coef.get(k).copied().unwrap_or(0.0))
            .collect();
        let all = parts.iter().flat_map(|p| p.classes().iter().cloned());
        let profile = Profile::from_weights(all);
        FragEngine {
            groups: Some(Grouped {
                groups,
                cpu_only,
                coef,
            }),
            ..Self::with_scale(profile, scale)
        }
    }

    /// New coefficients and squash scale for a mixed engine (see
    /// [`FragEngine::mixed`]); the per-part memo is kept. Ignored by an
    /// engine that is not grouped or when `coef` has the wrong length.
    pub fn set_mix(&mut self, coef: &[f64], scale: f64) {
        let Some(g) = self.groups.as_mut() else {
            return;
        };
        let scale = if scale > 0.0 { scale } else { 1000.0 };
        if coef.len() != g.coef.len() || (g.coef == coef && self.scale == scale) {
            return;
        }
        g.coef = coef.to_vec();
        self.scale = scale;
        let one_part = g.coef.len() == 1;
        if let Ok(memo) = self.memo.get_mut() {
            memo.frag.clear();
            if one_part {
                // evaluations of one part carry no parts to recombine
                memo.eval.clear();
            } else {
                memo.epoch += 1;
            }
        }
    }

    /// Squash each pod's `Δ` with `scale · gᵃ`, `g` the pod's GPU demand in
    /// GPUs ([`pod_gpus`]).
    pub fn with_size_exponent(mut self, a: f64) -> Self {
        self.size_exponent = a;
        self
    }

    /// Round the squashed score of a pod without GPU up instead of down.
    ///
    /// Such a pod takes CPU and memory only, so it can only add fragments:
    /// its `Δ ≤ 0`. Rounded down, its best bin (50, `Δ ∈ [0, step)`) holds
    /// `Δ = 0` alone and any fragment change, however small (a rare
    /// high-CPU class that no longer fits), costs a whole step; rounded up,
    /// its bins are laid out from the best value it can reach, every one a
    /// full step wide like a GPU pod's (`Δ ∈ (−step, 0]` scores 50).
    pub fn with_cpu_only_round_up(mut self, up: bool) -> Self {
        self.cpu_only_round_up = up;
        self
    }

    /// The squashed score of a value `v` (fragmentation change, milli
    /// GPU) of placing `pod`: `100 · sigmoid(v / pod_scale)`, rounded as
    /// the engine's evaluations are.
    pub fn squash(&self, pod: &Pod, v: f64) -> i64 {
        squash(v * 1000.0 / self.pod_scale(pod), self.rounds_up(pod))
    }

    /// Whether `pod`'s squashed score is rounded up.
    fn rounds_up(&self, pod: &Pod) -> bool {
        self.cpu_only_round_up && pod.gpu.is_none()
    }

    /// The squash scale of `pod`.
    pub fn pod_scale(&self, pod: &Pod) -> f64 {
        if self.size_exponent == 0.0 {
            self.scale
        } else {
            self.scale * pod_gpus(pod).powf(self.size_exponent)
        }
    }

    /// The target workload the fragmentation is measured against.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    fn model_id(&self, memo: &mut Memo, state: &ClusterState<'_>, node: NodeId) -> u32 {
        let name = node_model(state, node);
        if let Some(&id) = memo.node_model.get(node as usize)
            && id != u32::MAX
            && memo.model_names[id as usize] == name
        {
            return id;
        }
        let id = match memo.model_ids.get(name) {
            Some(&id) => id,
            None => {
                let id = memo.model_names.len() as u32;
                memo.model_ids.insert(name.to_string(), id);
                memo.model_names.push(name.to_string());
                memo.allowed.push(
                    self.profile
                        .classes()
                        .iter()
                        .map(|(c, _)| c.allows_model(name))
                        .collect(),
                );
                memo.allowed_groups
                    .push(self.groups.as_ref().map_or_else(Vec::new, |g| {
                        g.groups
                            .iter()
                            .map(|g| {
                                g.gpu_models.is_empty() || g.gpu_models.iter().any(|m| m == name)
                            })
                            .collect()
                    }));
                id
            }
        };
        if memo.node_model.len() <= node as usize {
            memo.node_model.resize(node as usize + 1, u32::MAX);
        }
        memo.node_model[node as usize] = id;
        id
    }

    fn sig(&self, memo: &mut Memo, state: &ClusterState<'_>, node: NodeId) -> Option<Sig> {
        let st = state.get(node);
        if st.gpu_free_milli.len() > SIG_GPUS {
            return None;
        }
        let model = self.model_id(memo, state, node);
        let n = state.node(node);
        let mut s = Sig {
            model,
            gpu_mem: n
                .gpus
                .first()
                .map_or(0, |g| g.memory_mib.min(u32::MAX as u64) as u32),
            cpu: st.free.cpu_milli,
            n: st.gpu_free_milli.len() as u8,
            lefts: [0; SIG_GPUS],
        };
        for (i, &f) in st.gpu_free_milli.iter().enumerate() {
            s.lefts[i] = if st.gpu_usable[i] {
                f.min(u16::MAX as u32) as u16
            } else {
                0
            };
        }
        s.sort();
        Some(s)
    }

    /// `F` of a state (milli-GPU).
    fn frag_of(&self, allowed: &[bool], gpu_mem: u64, cpu: u64, lefts: &[u16]) -> f64 {
        let t: u64 = lefts.iter().map(|&l| l as u64).sum();
        if t == 0 {
            return 0.0;
        }
        let mut f = 0.0;
        for (i, (c, w)) in self.profile.classes().iter().enumerate() {
            if c.gpu_count == 0 || !allowed.get(i).copied().unwrap_or(true) {
                f += w * t as f64;
                continue;
            }
            let m = share_milli(c.gpu_milli, c.gpu_mem_mib, gpu_mem).max(1) as u64;
            let (fit, q2) = fit_and_short(lefts, m);
            if fit >= c.gpu_count && cpu >= c.cpu_milli {
                f += w * q2 as f64;
            } else {
                f += w * t as f64;
            }
        }
        f
    }

    /// `F` of a state by class groups (see [`FragEngine::grouped`]), per
    /// part into `out` (one entry per part, zeroed by the caller).
    fn frag_grouped(
        g: &Grouped,
        allowed: &[bool],
        gpu_mem: u64,
        cpu: u64,
        lefts: &[u16],
        out: &mut [f64],
    ) {
        let t: u64 = lefts.iter().map(|&l| l as u64).sum();
        if t == 0 {
            return;
        }
        let t = t as f64;
        for (o, c) in out.iter_mut().zip(&g.cpu_only) {
            *o = c * t;
        }
        for (i, g) in g.groups.iter().enumerate() {
            let total = g.total();
            let f = &mut out[g.part];
            if !allowed.get(i).copied().unwrap_or(true) {
                *f += total * t;
                continue;
            }
            let m = share_milli(g.gpu_milli, g.gpu_mem_mib, gpu_mem).max(1) as u64;
            let (fit, q2) = fit_and_short(lefts, m);
            if fit >= g.gpu_count {
                let w = g.fitting(cpu);
                *f += w * q2 as f64 + (total - w) * t;
            } else {
                *f += total * t;
            }
        }
    }

    /// `F` of a state, not memoised: `allowed` is the model's entry of
    /// `memo.allowed` (plain engines) or `memo.allowed_groups` (grouped
    /// ones).
    fn frag_state(&self, allowed: &[bool], gpu_mem: u64, cpu: u64, lefts: &[u16]) -> f64 {
        let Some(g) = &self.groups else {
            return self.frag_of(allowed, gpu_mem, cpu, lefts);
        };
        if g.coef.len() == 1 {
            let mut out = [0.0];
            Self::frag_grouped(g, allowed, gpu_mem, cpu, lefts, &mut out);
            return g.coef[0] * out[0];
        }
        let mut out = vec![0.0; g.coef.len()];
        Self::frag_grouped(g, allowed, gpu_mem, cpu, lefts, &mut out);
        dot(&out, &g.coef)
    }

    /// `F` per part of a mixed engine's state `s` into `out` (memoised).
    fn parts_into(&self, memo: &mut Memo, s: &Sig, out: &mut [f64]) {
        if let Some(v) = memo.parts.get(s) {
            out.copy_from_slice(v);
            return;
        }
        out.fill(0.0);
        if let Some(g) = &self.groups {
            let allowed = &memo.allowed_groups[s.model as usize];
            Self::frag_grouped(g, allowed, s.gpu_mem as u64, s.cpu, s.lefts(), out);
        }
        if memo.parts.len() > 1 << 20 {
            memo.parts.clear();
        }
        memo.parts.insert(*s, out.into());
    }

    /// Parts of the engine's mix (1 unless made by [`FragEngine::mixed`]
    /// with several).
    fn part_count(&self) -> usize {
        self.groups.as_ref().map_or(1, |g| g.coef.len())
    }

    /// The entry of the memo's per-model allowed lists this engine reads.
    fn allowed_of<'m>(&self, memo: &'m Memo, model: u32) -> &'m [bool] {
        if self.groups.is_some() {
            &memo.allowed_groups[model as usize]
        } else {
            &memo.allowed[model as usize]
        }
    }

    fn frag_sig(&self, memo: &mut Memo, s: &Sig) -> f64 {
        if let Some(&f) = memo.frag.get(s) {
            return f;
        }
        let f = match &self.groups {
            Some(g) if g.coef.len() > 1 => {
                let mut out = vec![0.0; g.coef.len()];
                self.parts_into(memo, s, &mut out);
                dot(&out, &g.coef)
            }
            _ => {
                let allowed = self.allowed_of(memo, s.model);
                self.frag_state(allowed, s.gpu_mem as u64, s.cpu, s.lefts())
            }
        };
        if memo.frag.len() > 1 << 20 {
            memo.frag.clear();
        }
        memo.frag.insert(*s, f);
        f
    }

    /// Fragmentation of `node` now (milli-GPU).
    pub fn node_frag(&self, state: &ClusterState<'_>, node: NodeId) -> f64 {
        let Ok(mut memo) = self.memo.lock() else {
            return 0.0;
        };
        match self.sig(&mut memo, state, node) {
            Some(s) => self.frag_sig(&mut memo, &s),
            None => {
                let model = self.model_id(&mut memo, state, node);
                let st = state.get(node);
                let lefts: Vec<u16> = st
                    .gpu_free_milli
                    .iter()
                    .zip(&st.gpu_usable)
                    .map(|(&f, &u)| if u { f.min(u16::MAX as u32) as u16 } else { 0 })
                    .collect();
                let gm = state.node(node).gpus.first().map_or(0, |g| g.memory_mib);
                let allowed = self.allowed_of(&memo, model);
                self.frag_state(allowed, gm, st.free.cpu_milli, &lefts)
            }
        }
    }

    /// Sum of [`FragEngine::node_frag`] over all nodes.
    pub fn cluster_frag(&self, state: &ClusterState<'_>) -> f64 {
        (0..state.len() as NodeId)
            .map(|n| self.node_frag(state, n))
            .sum()
    }

    fn pod_class_id(memo: &mut Memo, pod: &Pod) -> u32 {
        if let Some((cpu, gpu, models, id)) = &memo.last_pod
            && *cpu == pod.requests.cpu_milli
            && *gpu == pod.gpu
            && *models == pod.gpu_models
        {
            return *id;
        }
        let c = PodClass::of(pod);
        let next = memo.pod_class_ids.len() as u32;
        let id = *memo.pod_class_ids.entry(c).or_insert(next);
        memo.last_pod = Some((pod.requests.cpu_milli, pod.gpu, pod.gpu_models.clone(), id));
        id
    }

    fn eval_sig(&self, memo: &mut Memo, s: &Sig, pod: &Pod) -> Eval {
        // the states after placing: (free milli of the GPU a share takes,
        // or 0, state)
        let mut after = *s;
        after.cpu = after.cpu.saturating_sub(pod.requests.cpu_milli);
        let mut afters: Vec<(u16, Sig)> = Vec::new();
        match pod.gpu {
            GpuRequest::None | GpuRequest::Whole(0) => afters.push((0, after)),
            GpuRequest::Whole(k) => {
                let mut left = k;
                for l in after.lefts[..after.n as usize].iter_mut().rev() {
                    if left > 0 && *l as u64 == GPU_MILLI {
                        *l = 0;
                        left -= 1;
                    }
                }
                after.sort();
                afters.push((0, after));
            }
            GpuRequest::Share { milli, memory_mib } => {
                let m = share_milli(milli, memory_mib, s.gpu_mem as u64);
                let mut prev = None;
                for i in 0..s.n as usize {
                    let l = s.lefts[i];
                    if (l as u32) < m || prev == Some(l) {
                        continue;
                    }
                    prev = Some(l);
                    let mut a = after;
                    a.lefts[i] = l - m as u16;
                    a.sort();
                    afters.push((l, a));
                }
            }
        }
        let k = self.part_count();
        if k == 1 {
            let before = self.frag_sig(memo, s);
            let deltas = afters
                .iter()
                .map(|(l, a)| (*l, before - self.frag_sig(memo, a)))
                .collect();
            return Eval::new(deltas, self.pod_scale(pod), self.rounds_up(pod));
        }
        // a mixed engine keeps Δ per part, so a new mix recombines them
        // without evaluating a state again
        let mut before = vec![0.0; k];
        self.parts_into(memo, s, &mut before);
        let mut a = vec![0.0; k];
        let mut parts = Vec::with_capacity(afters.len() * k);
        for (_, sig) in &afters {
            self.parts_into(memo, sig, &mut a);
            parts.extend(before.iter().zip(&a).map(|(b, a)| b - a));
        }
        let mut e = Eval {
            deltas: afters.iter().map(|(l, _)| (*l, 0.0)).collect(),
            squashed: vec![0; afters.len()],
            parts,
            epoch: memo.epoch,
        };
        self.remix(&mut e, pod);
        e
    }

    /// Recombines a mixed engine's evaluation with the current mix.
    fn remix(&self, e: &mut Eval, pod: &Pod) {
        let Some(g) = &self.groups else { return };
        let k = g.coef.len();
        if e.parts.len() != e.deltas.len() * k {
            return;
        }
        let scale = self.pod_scale(pod);
        let up = self.rounds_up(pod);
        for (i, d) in e.deltas.iter_mut().enumerate() {
            d.1 = dot(&e.parts[i * k..(i + 1) * k], &g.coef);
            e.squashed[i] = squash(d.1 * 1000.0 / scale, up);
        }
    }

    /// Runs `f` on the evaluation of `pod` on `node` (memoised by state).
    pub(crate) fn with_eval<R>(
        &self,
        pod: &Pod,
        node: NodeId,
        state: &ClusterState<'_>,
        f: impl FnOnce(&Eval) -> R,
    ) -> R {
        let Ok(mut guard) = self.memo.lock() else {
            return f(&Eval::default());
        };
        let Some(s) = self.sig(&mut guard, state, node) else {
            drop(guard);
            return f(&self.eval_direct(pod, node, state));
        };
        let memo = &mut *guard;
        let cls = Self::pod_class_id(memo, pod);
        let epoch = memo.epoch;
        if let Some(e) = memo.eval.get_mut(&(s, cls)) {
            if e.epoch != epoch {
                self.remix(e, pod);
                e.epoch = epoch;
            }
            return f(e);
        }
        let e = self.eval_sig(memo, &s, pod);
        let r = f(&e);
        if memo.eval.len() > 1 << 20 {
            memo.eval.clear();
        }
        memo.eval.insert((s, cls), e);
        r
    }

    /// Evaluation without memo, for nodes with more than 16 GPUs.
    fn eval_direct(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Eval {
        let Ok(mut memo) = self.memo.lock() else {
            return Eval::default();
        };
        let model = self.model_id(&mut memo, state, node);
        let allowed = self.allowed_of(&memo, model).to_vec();
        drop(memo);
        let st = state.get(node);
        let gm = state.node(node).gpus.first().map_or(0, |g| g.memory_mib);
        let lefts: Vec<u16> = st
            .gpu_free_milli
            .iter()
            .zip(&st.gpu_usable)
            .map(|(&f, &u)| if u { f.min(u16::MAX as u32) as u16 } else { 0 })
            .collect();
        let cpu = st.free.cpu_milli;
        let before = self.frag_state(&allowed, gm, cpu, &lefts);
        let cpu_after = cpu.saturating_sub(pod.requests.cpu_milli);
        let mut deltas = Vec::new();
        match pod.gpu {
            GpuRequest::None | GpuRequest::Whole(0) => {
                deltas.push((0, before - self.frag_state(&allowed, gm, cpu_after, &lefts)));
            }
            GpuRequest::Whole(k) => {
                let mut a = lefts.clone();
                let mut left = k;
                for l in a.iter_mut() {
                    if left > 0 && *l as u64 == GPU_MILLI {
                        *l = 0;
                        left -= 1;
                    }
                }
                deltas.push((0, before - self.frag_state(&allowed, gm, cpu_after, &a)));
            }
            GpuRequest::Share { milli, memory_mib } => {
                let m = share_milli(milli, memory_mib, gm);
                for i in 0..lefts.len() {
                    let l = lefts[i];
                    if (l as u32) < m || deltas.iter().any(|(x, _)| *x == l) {
                        continue;
                    }
                    let mut a = lefts.clone();
                    a[i] = l - m as u16;
                    deltas.push((l, before - self.frag_state(&allowed, gm, cpu_after, &a)));
                }
            }
        }
        Eval::new(deltas, self.pod_scale(pod), self.rounds_up(pod))
    }
}

/// A pod's GPU demand in GPUs for the squash: `k` whole GPUs, a share's
/// fraction (at least 0.05), 1 for a pod without GPU.
pub fn pod_gpus(pod: &Pod) -> f64 {
    let g = match pod.gpu {
        GpuRequest::Share { milli, .. } => milli as f64,
        GpuRequest::Whole(k) if k > 0 => (k as u64 * GPU_MILLI) as f64,
        _ => GPU_MILLI as f64,
    };
    g.max(50.0) / GPU_MILLI as f64
}

/// `100 · sigmoid(Δ / 1000)`, before it is made an integer.
fn sigmoid_percent(delta: f64) -> f64 {
    100.0 / (1.0 + (-delta / 1000.0).exp())
}

/// The reference's integer score of a fragmentation change (rounded down).
pub fn sigmoid_score(delta: f64) -> i64 {
    sigmoid_percent(delta) as i64
}

/// [`sigmoid_score`], rounded up instead of down when `up`.
fn squash(delta: f64, up: bool) -> i64 {
    if up {
        sigmoid_percent(delta).ceil() as i64
    } else {
        sigmoid_score(delta)
    }
}

/// The class distribution of the snapshot's pods (pending and running).
pub(crate) fn derive_profile(env: &PackEnv<'_, '_>) -> Profile {
    Profile::from_pods(env.snapshot.pods.iter().map(|p| &*p.pod))
}

/// [`derive_profile`] from class counts kept across calls: updated from
/// the pods added and removed when the caller tracks them
/// (`PackEnv::pods_changed`), counted over every pod otherwise. The same
/// profile either way (the counts are the same multiset).
pub(crate) fn derive_profile_kept(
    counts: &mut Option<std::collections::BTreeMap<super::profile::PodClass, u64>>,
    env: &PackEnv<'_, '_>,
) -> Profile {
    use super::profile::PodClass;
    match (env.pods_changed, counts.as_mut()) {
        (Some(d), Some(c)) => {
            for p in &d.removed {
                let k = PodClass::of(p);
                if let Some(n) = c.get_mut(&k) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        c.remove(&k);
                    }
                }
            }
            for p in &d.added {
                *c.entry(PodClass::of(p)).or_insert(0) += 1;
            }
        }
        _ => {
            let mut c = std::collections::BTreeMap::new();
            for p in &env.snapshot.pods {
                *c.entry(PodClass::of(&p.pod)).or_insert(0) += 1;
            }
            *counts = Some(c);
        }
    }
    match counts {
        Some(c) => Profile::from_counts(c, Default::default()),
        None => derive_profile(env),
    }
}

/// FGD placement (see the module documentation).
pub struct FgdPacker {
    explicit: bool,
    engine: FragEngine,
    whole: WholeChooser,
    /// Bumped when `prepare` builds a new engine ([`Packer::generation`]).
    generation: u64,
}

impl Default for FgdPacker {
    fn default() -> Self {
        Self::new()
    }
}

impl FgdPacker {
    /// FGD whose target workload is derived in `prepare` from the
    /// snapshot's pods (pending and running).
    pub fn new() -> Self {
        FgdPacker {
            explicit: false,
            engine: FragEngine::new(Profile::default()),
            whole: WholeChooser::new(),
            generation: 0,
        }
    }

    /// FGD against an explicit target workload; as in the reference, only
    /// its typical pods count ([`Profile::typical`] at 95 %).
    pub fn with_profile(profile: Profile) -> Self {
        FgdPacker {
            explicit: true,
            engine: FragEngine::new(profile.typical(TYPICAL_COVERAGE)),
            whole: WholeChooser::new(),
            generation: 0,
        }
    }

    /// The fragmentation engine (its profile and memo).
    pub fn engine(&self) -> &FragEngine {
        &self.engine
    }
}

impl Packer for FgdPacker {
    fn name(&self) -> &'static str {
        super::names::PolicyName::Fgd.as_str()
    }

    fn prepare(&mut self, env: &PackEnv<'_, '_>) {
        if !self.explicit {
            let p = derive_profile(env).typical(TYPICAL_COVERAGE);
            if &p != self.engine.profile() {
                self.engine = FragEngine::new(p);
                self.generation += 1;
            }
        }
    }

    /// The engine's profile is all `prepare` sets.
    fn generation(&self) -> Option<u64> {
        Some(self.generation)
    }

    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        match pod.gpu {
            GpuRequest::Share { .. } => self.engine.with_eval(pod, node, state, |e| {
                let mut best: Option<(i64, usize, u32)> = None;
                for_each_share(state, pod, node, |g, m, free| {
                    let Some((_, s)) = e.for_left(free) else {
                        return;
                    };
                    if best.is_none_or(|(b, _, _)| s > b) {
                        best = Some((s, g, m));
                    }
                });
                best.map(|(score, g, m)| Placement {
                    score: score.into(),
                    gpus: share_on(pod, g, m),
                })
            }),
            _ => {
                let gpus = self.whole.assignment(state, pod, node, || None)?;
                let (_, s) = self.engine.with_eval(pod, node, state, |e| e.first())?;
                Some(Placement {
                    score: s.into(),
                    gpus,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::{GpuAssignment, PodState, Snapshot};
    use gpusched_testkit::packing::*;

    fn class(cpu: u64, milli: u32, count: u32) -> PodClass {
        PodClass {
            cpu_milli: cpu,
            gpu_milli: milli,
            gpu_count: count,
            gpu_mem_mib: 0,
            gpu_models: vec![],
        }
    }

    #[test]
    fn fragmentation_of_a_node() {
        // half the pods want 0.5 GPU, half want one whole GPU
        let prof = Profile::new([(class(1000, 500, 1), 1.0), (class(1000, 1000, 1), 1.0)]);
        let e = FragEngine::new(prof);
        let nodes = vec![node("a", 2, 8000, "T4")];
        let mut cs = ClusterState::new(&nodes);
        assert_eq!(e.node_frag(&cs, 0), 0.0);
        take(&mut cs, 0, 0, 700, 0);
        // free 300 + 1000: for 0.5-GPU pods 300 is fragment, for 1-GPU pods too
        assert!((e.node_frag(&cs, 0) - 300.0).abs() < 1e-9);
        take(&mut cs, 0, 1, 600, 0);
        // free 300 + 400: nobody fits -> everything is fragment
        assert!((e.node_frag(&cs, 0) - 700.0).abs() < 1e-9);
        // no CPU left: everything is fragment for every class
        let nodes = vec![node("b", 2, 500, "T4")];
        let cs = ClusterState::new(&nodes);
        assert!((e.node_frag(&cs, 0) - 2000.0).abs() < 1e-9);
    }

    #[test]
    fn fgd_avoids_creating_fragments() {
        let prof = Profile::new([(class(1000, 500, 1), 1.0)]);
        let nodes = vec![node("a", 2, 32_000, "T4"), node("b", 2, 32_000, "T4")];
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 0, 0, 500, 0);
        take(&mut cs, 0, 1, 1000, 0);
        take(&mut cs, 1, 0, 300, 0);
        take(&mut cs, 1, 1, 1000, 0);
        let p = FgdPacker::with_profile(prof);
        // a 0.5 share: on node a it leaves 0 free (no fragment); on node b it
        // would leave 200 that no 0.5 pod can use.
        let (n, pl) = pick(&p, &pod(1000, share(500)), &cs).unwrap();
        assert_eq!(n, 0);
        assert_eq!(
            pl.gpus,
            GpuAssignment::Share {
                gpu: 0,
                milli: 500,
                memory_mib: 0
            }
        );
        // a 0.2 share: on b (700 -> 500 still fits a 0.5 pod; a's 500 -> 300
        // would not)
        let (n, pl) = pick(&p, &pod(1000, share(200)), &cs).unwrap();
        assert_eq!(n, 1);
        assert!(matches!(pl.gpus, GpuAssignment::Share { gpu: 0, .. }));
    }

    #[test]
    fn profile_derived_from_snapshot_when_absent() {
        let nodes = vec![node("a", 2, 32_000, "T4")];
        let mut snap = Snapshot {
            nodes: nodes.clone(),
            ..Default::default()
        };
        snap.pods.push(PodState::pending(pod(1000, share(500))));
        let cs = ClusterState::new(&nodes);
        let mut p = FgdPacker::new();
        prepare(&mut p, &snap, &cs, 0);
        assert_eq!(p.engine().profile().classes().len(), 1);
        assert_eq!(p.engine().profile().classes()[0].0.gpu_milli, 500);
        assert!(p.place(&pod(1000, share(500)), 0, &cs).is_some());
    }

    #[test]
    fn grouped_evaluation_equals_the_plain_one() {
        let mut classes = Vec::new();
        for (i, (milli, count)) in [(500, 1), (1000, 1), (1000, 8), (250, 1), (1000, 2)]
            .into_iter()
            .enumerate()
        {
            for cpu in [1000u64, 4000, 9000, 30_000] {
                let mut c = class(cpu, milli, count);
                if i == 3 {
                    c.gpu_models = vec!["T4".into()];
                }
                classes.push((c, (cpu / 1000 + i as u64) as f64));
            }
        }
        classes.push((class(6000, 0, 0), 3.0));
        let prof = Profile::new(classes);
        let plain = FragEngine::new(prof.clone());
        let grouped = FragEngine::grouped(prof, 1000.0);
        let nodes = vec![node("a", 8, 32_000, "G2"), node("b", 2, 16_000, "T4")];
        let mut cs = ClusterState::new(&nodes);
        let mut seen = 0;
        for (n, g, m) in [
            (0, 0, 300),
            (1, 0, 750),
            (0, 1, 1000),
            (0, 2, 600),
            (1, 1, 250),
        ] {
            take(&mut cs, n, g, m, 7000);
            for n in 0..2 {
                let (a, b) = (plain.node_frag(&cs, n), grouped.node_frag(&cs, n));
                assert!((a - b).abs() < 1e-6, "{a} vs {b}");
                seen += (a > 0.0) as u32;
                for p in [pod(2000, share(500)), pod(5000, GpuRequest::Whole(1))] {
                    let da = plain.with_eval(&p, n, &cs, |e| e.deltas.clone());
                    let db = grouped.with_eval(&p, n, &cs, |e| e.deltas.clone());
                    assert_eq!(da.len(), db.len());
                    for (x, y) in da.iter().zip(&db) {
                        assert_eq!(x.0, y.0);
                        assert!((x.1 - y.1).abs() < 1e-6, "{x:?} vs {y:?}");
                    }
                }
            }
        }
        assert!(seen >= 5);
    }

    #[test]
    fn a_mixed_engine_is_the_plain_engine_of_its_mix_and_keeps_its_memo() {
        // two parts: unrestricted classes, and T4-only classes
        let mut free = Vec::new();
        let mut t4 = Vec::new();
        for (milli, count) in [(500, 1), (1000, 1), (1000, 2)] {
            for cpu in [1000u64, 8000] {
                free.push((class(cpu, milli, count), (cpu / 1000) as f64));
                let mut c = class(cpu, milli, count);
                c.gpu_models = vec!["T4".into()];
                t4.push((c, 2.0));
            }
        }
        free.push((class(6000, 0, 0), 3.0));
        let parts = [Profile::from_weights(free), Profile::from_weights(t4)];
        let weighted = |coef: &[f64]| {
            Profile::new(
                parts
                    .iter()
                    .zip(coef)
                    .flat_map(|(p, k)| p.classes().iter().map(move |(c, w)| (c.clone(), w * k))),
            )
        };
        let nodes = vec![node("a", 8, 32_000, "G2"), node("b", 2, 16_000, "T4")];
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 0, 0, 300, 7000);
        take(&mut cs, 1, 1, 750, 3000);
        let mut mixed = FragEngine::mixed(&parts, &[1.0, 1.0], 1000.0);
        for coef in [[1.0, 1.0], [0.25, 2.0], [1.0, 0.0]] {
            // the plain engine's profile is normalised: scale the mix alike
            let z: f64 = parts
                .iter()
                .zip(&coef)
                .map(|(p, k)| k * p.classes().iter().map(|(_, w)| w).sum::<f64>())
                .sum();
            let scaled: Vec<f64> = coef.iter().map(|k| k / z).collect();
            mixed.set_mix(&scaled, 1000.0);
            let plain = FragEngine::new(weighted(&coef));
            for n in 0..2 {
                let (a, b) = (plain.node_frag(&cs, n), mixed.node_frag(&cs, n));
                assert!(
                    a > 0.0 && (a - b).abs() < 1e-6,
                    "{coef:?} node {n}: {a} vs {b}"
                );
                let p = pod(2000, share(500));
                let da = plain.with_eval(&p, n, &cs, |e| e.deltas.clone());
                let db = mixed.with_eval(&p, n, &cs, |e| e.deltas.clone());
                assert_eq!(da.len(), db.len());
                for (x, y) in da.iter().zip(&db) {
                    assert!(x.0 == y.0 && (x.1 - y.1).abs() < 1e-6, "{x:?} vs {y:?}");
                }
            }
        }
        // every state evaluated once per part, not once per mix
        let memo = mixed.memo.lock().unwrap();
        assert!(!memo.parts.is_empty());
        assert!(memo.parts.values().all(|v| v.len() == 2));
        // the T4-only part sees node b, not node a (its model is not allowed)
        let t4_only = FragEngine::mixed(&parts, &[0.0, 1.0], 1000.0);
        let all_free = cs.get(0).free.gpu_milli as f64;
        assert!((t4_only.node_frag(&cs, 0) - 12.0 * all_free).abs() < 1e-6);
        assert!(t4_only.node_frag(&cs, 1) < 12.0 * cs.get(1).free.gpu_milli as f64);
    }

    #[test]
    fn sigmoid_quantization() {
        assert_eq!(sigmoid_score(0.0), 50);
        assert_eq!(sigmoid_score(1e9), 100);
        assert_eq!(sigmoid_score(-1e9), 0);
        // rounded up: no change and a small loss share the top bin of a
        // pod that can only lose (a CPU-only pod), a larger loss does not
        assert_eq!(squash(0.0, true), 50);
        assert_eq!(squash(-10.0, true), 50);
        assert_eq!(squash(-10.0, false), 49);
        assert_eq!(squash(-50.0, true), 49);
        assert_eq!(squash(-1e9, true), 0);
    }
}

#[cfg(test)]
mod kept_profile_tests {
    use super::*;
    use gpusched_core::{ClusterState, PodState, PodsChanged, Snapshot};
    use gpusched_model::{GpuRequest, Pod};

    fn pod(name: &str, gpu: GpuRequest, models: &[&str], cpu: u64) -> Pod {
        let mut p = Pod::new(name, "q");
        p.gpu = gpu;
        p.gpu_models = models.iter().map(|m| m.to_string()).collect();
        p.requests.cpu_milli = cpu;
        p
    }

    /// Counts kept across calls and updated from the pods added and removed
    /// give the profile a count over every pod gives, step after step —
    /// and the counts are really kept (a delta alone moves them).
    #[test]
    fn kept_class_counts_follow_the_changes_exactly() {
        let shapes = [
            (GpuRequest::Whole(1), vec![], 1000),
            (GpuRequest::Whole(8), vec!["H100"], 2000),
            (
                GpuRequest::Share {
                    milli: 500,
                    memory_mib: 0,
                },
                vec![],
                500,
            ),
            (GpuRequest::None, vec![], 4000),
        ];
        let mut snap = Snapshot::default();
        let mut counts = None;
        let mut seq = 0u32;
        for step in 0..40u32 {
            let mut d = PodsChanged::default();
            // add two, remove one (when there is one), change one's spec
            for k in 0..2 {
                let (g, m, c) = &shapes[((step * 3 + k) % 4) as usize];
                let models: Vec<&str> = m.to_vec();
                let p = pod(&format!("p{seq}"), *g, &models, *c);
                seq += 1;
                d.added.push(p.clone().into());
                snap.pods.push(PodState::pending(p));
            }
            if step % 3 == 2 {
                let gone = snap.pods.remove((step as usize * 7) % snap.pods.len());
                d.removed.push(gone.pod);
            }
            if step % 5 == 4 {
                let i = (step as usize * 11) % snap.pods.len();
                d.removed.push(snap.pods[i].pod.clone());
                std::sync::Arc::make_mut(&mut snap.pods[i].pod)
                    .requests
                    .cpu_milli += 250;
                d.added.push(snap.pods[i].pod.clone());
            }
            let nodes = Vec::new();
            let cs = ClusterState::new(&nodes);
            let env = PackEnv {
                snapshot: &snap,
                state: &cs,
                seed: 1,
                // the first call counts every pod
                pods_changed: (step > 0).then_some(&d),
            };
            let kept = derive_profile_kept(&mut counts, &env);
            assert_eq!(kept, derive_profile(&env), "step {step}");
        }
        // the counts are kept: an empty delta changes nothing, a delta
        // moves them without looking at the pods
        let total: u64 = counts.as_ref().map_or(0, |c| c.values().sum());
        assert_eq!(total, snap.pods.len() as u64);
    }
}
