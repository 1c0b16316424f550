//! `gpusched`: our default packing policy — fragmentation gradient descent
//! against the *whole* class distribution of the workload, each class
//! weighted by its pods *and by the pressure on the GPUs it may use*,
//! squashed more coarsely than the reference and in proportion to the
//! pod's GPU size, with ties going to the smaller node.
//!
//! With `Δ` the change of node fragmentation of [`super::fgd`] (positive:
//! the placement removes fragments) computed against every pod class (the
//! reference keeps only the classes covering 95 % of the pods, which drops
//! all 8-GPU classes of the Alibaba trace and most model-restricted ones),
//! `s` = [`GpuschedConfig::quantize_scale`],
//! `a` = [`GpuschedConfig::size_exponent`] and `g` the pod's GPU demand in
//! GPUs (`k` whole GPUs, a share's fraction, at least 0.05; 1 for a
//! CPU-only pod):
//!
//! ```text
//! w_c     = p_c · π_c,  π_c = cluster GPUs / GPUs of the models c may use
//! F(n)    = Σ_c w_c · f_c(n)           (f_c: FGD's fragment of n for c)
//! primary = ⌊100 · sigmoid(Δ / (s · gᵃ))⌋     (quantize; else ⌊Δ⌋;
//!           ⌈…⌉ for a CPU-only pod, see below)
//! score   = (primary, tie), compared in that order
//! ```
//!
//! `p_c` is the class's share of the pods ([`ClassWeight`]). The pressure
//! `π_c` is 1 for a class that may use any GPU and grows as the GPUs a
//! restricted class may use get scarcer: for such a class every free GPU
//! it cannot reach is fragment, so with `π` a pod that could go anywhere
//! gains most by landing where the restricted classes of *scarce* models
//! cannot go (FGD's plain pod weights give every model the same bonus when
//! the restrictions are spread evenly). Weights are not renormalised, so an
//! unrestricted workload scores exactly as with pod weights.
//!
//! A restriction counts only as far as it binds
//! ([`GpuschedConfig::pressure_by_demand`]): with `q_S` the share of the
//! GPU demand restricted to the model set `S`, `U` the cluster's free GPU
//! milli and `R_S` the free GPU milli on `S`, `ρ_S = q_S·U/R_S` is how much
//! of what is left on `S` the restricted pods will need if arrivals go on
//! until the cluster is full. Each restricted class is split into an
//! unrestricted twin of weight `p_c·(1 − ℓ_S)` and itself with `p_c·ℓ_S`,
//! `ℓ_S = min(1, ρ_S)⁸` (a soft step at `ρ_S = 1`; recomputed in `prepare`,
//! in steps of 1/16, with a one-step hysteresis): a model with room to spare for its restricted pods
//! is not kept free, one that will run short is.
//!
//! `tie` puts the cluster's largest nodes last
//! ([`GpuschedConfig::size_order`]). What is left
//! equal falls to the node order (the core: lowest node id), i.e. first
//! fit among placements of nearly equal fragmentation. Defaults (measured on the openb trace and
//! its variants, see `docs/placement.md`): full distribution, pressure
//! weights, `s = 2500`, `a = 1` (the squash scales with the pod: a small
//! share's `Δ` is small, so its near-equal placements tie and go first
//! fit, while an 8-GPU pod's large `Δ` is still told apart), largest nodes
//! last. A share goes on the GPU with the best score, then the least
//! compute left. Knobs tried and dropped (a free-GPU weight, a stranded-CPU
//! penalty, best-fit and least-contested tie-breaks, bin-packing secondary
//! keys, load pressure, demand-scaled node sizes) are recorded with their
//! figures in `docs/placement.md`; they are no longer in the code.
//!
//! A CPU-only pod can only add fragments (`v ≤ 0`), so its squash is
//! rounded up ([`GpuschedConfig::cpu_only_round_up`]): rounded down, its
//! top bin would hold `v = 0` alone, and a fragment change far below a
//! step (a rare high-CPU class that no longer fits on the node) would
//! cost a whole step, overruling the tie order.
//!
//! `F` is evaluated by [`FragEngine::grouped`] (classes grouped by GPU
//! shape, CPU by binary search) and the squash is computed once per node
//! state and pod class, which makes the policy cheaper per decision than
//! the reference FGD despite the full distribution.

use super::fgd::{FragEngine, derive_profile_kept};
use super::profile::{PodClass, Profile};
use super::util::{WholeChooser, for_each_share, share_on};
use gpusched_core::{ClusterState, NodeId, PackEnv, Packer, Placement, Score};
use gpusched_model::{GpuRequest, Pod};

/// Knobs of [`GpuschedPacker`] (the `gpusched` policy's arguments in the
/// scheduler configuration; omitted fields take their defaults).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuschedConfig {
    /// Squash the value like the reference FGD (`⌊100·sigmoid(v/1000)⌋`)
    /// before the tie-break, instead of comparing it exactly.
    pub quantize: bool,
    /// Scale of the squashing (milli-GPU; the reference uses 1000): the
    /// larger, the coarser the score and the more often ties fall to the
    /// node order (first fit).
    pub quantize_scale: f64,
    /// Exponent `a` of the pod's GPU demand `g` in the squash scale
    /// `s · gᵃ` (0: one scale for every pod).
    pub size_exponent: f64,
    /// Round a CPU-only pod's squashed value up instead of down (see
    /// [`FragEngine::with_cpu_only_round_up`]): its `Δ` is never positive,
    /// so its bins are laid out from 0 down, each a full step wide.
    pub cpu_only_round_up: bool,
    /// Node-size preference among equal scores; what is left equal goes to
    /// the node order.
    pub size_order: SizeOrder,
    /// Share of the workload's pods whose classes count (1.0: all; the
    /// reference FGD uses 0.95).
    pub coverage: f64,
    /// How the pod classes of the target workload are weighted in the
    /// expected fragmentation.
    pub class_weight: ClassWeight,
    /// Count a model restriction only as far as it binds: a class
    /// restricted to the model set `S` is split into an unrestricted twin
    /// of weight `p_c·(1 − ℓ_S)` and the restricted class of weight
    /// `p_c·ℓ_S` (then pressure-weighted), with `ℓ_S` the scarcity level of
    /// `S` ([`scarcity_level`]). Off: `ℓ_S = 1`.
    pub pressure_by_demand: bool,
    /// Exponent `k` of the scarcity level `ℓ_S = min(1, ρ_S)ᵏ` (large:
    /// a step at `ρ_S = 1`).
    pub scarcity_exponent: f64,
}

/// How equal scores are ordered by the size (GPU count) of the node.
/// Read by name (`largest-last`, …); anything else, a number included, is
/// refused with the names it takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SizeOrder {
    /// Nodes of the cluster's largest GPU count last, the others in node
    /// order: the largest nodes hold most of the capacity and are the only
    /// ones the largest pods can use, while ordering the smaller sizes
    /// among themselves sends small pods onto the 2- and 4-GPU nodes that
    /// 2- and 4-GPU pods fill exactly (measured, `docs/placement.md`).
    #[default]
    LargestLast,
    /// Nodes with fewer GPUs first (the default until 2026-12-03).
    FewerFirst,
    /// Nodes with more GPUs first.
    MoreFirst,
    /// No size preference: the node order.
    None,
}

impl SizeOrder {
    /// Every order with its configuration name.
    pub const NAMES: [(&'static str, SizeOrder); 4] = [
        ("largest-last", SizeOrder::LargestLast),
        ("fewer-first", SizeOrder::FewerFirst),
        ("more-first", SizeOrder::MoreFirst),
        ("none", SizeOrder::None),
    ];
}

impl<'de> serde::Deserialize<'de> for SizeOrder {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // any scalar, so that a number (the -1/0/1 of before) gets the
        // field's own message instead of a generic type error
        struct V;
        impl V {
            fn refuse<E: serde::de::Error>(v: impl std::fmt::Display) -> E {
                let names: Vec<&str> = SizeOrder::NAMES.iter().map(|(n, _)| *n).collect();
                E::custom(format!(
                    "size_order: {v} (must be one of {})",
                    names.join(", ")
                ))
            }
        }
        impl serde::de::Visitor<'_> for V {
            type Value = SizeOrder;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a node-size order name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SizeOrder, E> {
                SizeOrder::NAMES
                    .iter()
                    .find(|(n, _)| *n == v)
                    .map(|(_, o)| *o)
                    .ok_or_else(|| V::refuse(format_args!("{v:?}")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<SizeOrder, E> {
                Err(V::refuse(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<SizeOrder, E> {
                Err(V::refuse(v))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<SizeOrder, E> {
                Err(V::refuse(v))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<SizeOrder, E> {
                Err(V::refuse(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Weight of a pod class in the expected fragmentation `F = Σ_c w_c·f_c`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClassWeight {
    /// Share of the pods (the FGD paper's rule).
    Pods,
    /// Share of the GPU demand: pods × GPU milli ([`Profile::gpu_weighted`]);
    /// CPU-only classes drop out.
    Gpu,
    /// Pressure: share of the pods divided by the share of the cluster's
    /// GPUs the class may use (its allowed models), so a class that can
    /// only use a scarce model counts the more the scarcer the model is.
    /// Equals `Pods` when no class is restricted.
    #[default]
    Pressure,
    /// As `Pressure`, on the share of the GPU demand instead of the pods.
    GpuPressure,
}

/// A numeric knob: its YAML name, value, rule and the rule in words.
type Check = (&'static str, f64, fn(f64) -> bool, &'static str);

impl GpuschedConfig {
    /// Refuses knobs outside their domain (a negative exponent would give
    /// scarcity levels above 1, i.e. negative class weights): the first
    /// offending field, by its YAML name, with the rule it breaks.
    pub fn validate(&self) -> Result<(), String> {
        let checks: [Check; 4] = [
            ("quantize_scale", self.quantize_scale, |v| v > 0.0, "> 0"),
            ("size_exponent", self.size_exponent, |v| v >= 0.0, ">= 0"),
            (
                "coverage",
                self.coverage,
                |v| v > 0.0 && v <= 1.0,
                "in (0, 1]",
            ),
            (
                "scarcity_exponent",
                self.scarcity_exponent,
                |v| v > 0.0,
                "> 0",
            ),
        ];
        for (name, v, ok, rule) in checks {
            if !v.is_finite() || !ok(v) {
                return Err(format!("{name}: {v} (must be finite and {rule})"));
            }
        }
        Ok(())
    }
}

impl Default for GpuschedConfig {
    fn default() -> Self {
        GpuschedConfig {
            quantize: true,
            quantize_scale: 2500.0,
            size_exponent: 1.0,
            cpu_only_round_up: true,
            size_order: SizeOrder::LargestLast,
            coverage: 1.0,
            class_weight: ClassWeight::Pressure,
            pressure_by_demand: true,
            scarcity_exponent: 8.0,
        }
    }
}

/// Our default packing policy (see the module documentation).
pub struct GpuschedPacker {
    explicit: bool,
    cfg: GpuschedConfig,
    engine: FragEngine,
    whole: WholeChooser,
    /// The target workload as given (before the coverage cut).
    source: Profile,
    /// GPUs of the cluster per model (for [`ClassWeight::Pressure`]).
    reach: std::collections::BTreeMap<String, u64>,
    /// GPUs of the cluster's largest node ([`SizeOrder::LargestLast`]).
    largest: u32,
    /// Node count `reach` and `largest` were counted for.
    shape_nodes: usize,
    /// Scarcity level `ℓ_S` per restricted model set, in 1/[`LEVELS`]
    /// (absent: full, [`LEVELS`]).
    scarcity: std::collections::BTreeMap<Vec<String>, u32>,
    /// Share of the GPU demand restricted to each model set `S`
    /// (`q_S`, from the target workload).
    restricted: std::collections::BTreeMap<Vec<String>, f64>,
    /// The parts of the engine's mixed profile (see `with_engine`).
    parts: Vec<Profile>,
    /// The restricted model set of each pair of parts after the first.
    part_sets: Vec<Vec<String>>,
    /// Bumped when `prepare` changes anything `place` reads
    /// ([`Packer::generation`]).
    generation: u64,
    /// The pods counted by class, kept across `prepare` calls to derive
    /// the target workload (updated from `PackEnv::pods_changed`).
    class_counts: Option<std::collections::BTreeMap<super::profile::PodClass, u64>>,
}

/// Steps of the scarcity level (the engine is rebuilt when a level moves
/// by one step).
pub const LEVELS: u32 = 16;

/// Scarcity level of a model set `S` in `0..=LEVELS`: `min(1, ρ_S)` with
/// `ρ_S = q_S · U / R_S` rounded to `1/LEVELS`, where `q_S` is the share of
/// the arriving GPU demand restricted to `S`, `U` the cluster's free GPU
/// milli and `R_S` the free GPU milli on `S`'s models. If arrivals go on
/// until the cluster is full, `q_S·U` of them can only use `S`: at `ρ_S ≥ 1`
/// every milli of `S` taken by another pod is one a restricted pod misses,
/// at `ρ_S ≪ 1` keeping `S` free only idles it.
pub fn scarcity_level(q: f64, free_total: u64, free_on_set: u64, exponent: f64) -> u32 {
    scarcity_raw(q, free_total, free_on_set, exponent).round() as u32
}

/// [`scarcity_level`] before rounding (in `0.0..=LEVELS`).
fn scarcity_raw(q: f64, free_total: u64, free_on_set: u64, exponent: f64) -> f64 {
    if free_on_set == 0 {
        return LEVELS as f64;
    }
    let rho = q * free_total as f64 / free_on_set as f64;
    rho.clamp(0.0, 1.0).powf(exponent) * LEVELS as f64
}

/// The next level of a set at level `current` whose unrounded level is
/// now `raw`: it moves only when `raw` is a whole step away (hysteresis:
/// a `ρ` wavering around a step boundary does not rebuild the engine at
/// every pod).
pub fn next_level(current: u32, raw: f64) -> u32 {
    if (raw - current as f64).abs() >= 1.0 {
        raw.round() as u32
    } else {
        current
    }
}

impl Default for GpuschedPacker {
    fn default() -> Self {
        Self::new()
    }
}

impl GpuschedPacker {
    /// Target workload derived in `prepare` from the snapshot's pods.
    pub fn new() -> Self {
        GpuschedPacker {
            explicit: false,
            cfg: GpuschedConfig::default(),
            engine: FragEngine::new(Profile::default()),
            whole: WholeChooser::new(),
            source: Profile::default(),
            reach: Default::default(),
            largest: 0,
            shape_nodes: usize::MAX,
            scarcity: Default::default(),
            restricted: Default::default(),
            parts: Vec::new(),
            part_sets: Vec::new(),
            generation: 0,
            class_counts: None,
        }
    }

    /// Explicit target workload.
    pub fn with_profile(profile: Profile) -> Self {
        GpuschedPacker {
            explicit: true,
            ..Self::new()
        }
        .with_engine(profile)
    }

    fn with_engine(mut self, profile: Profile) -> Self {
        self.source = profile.clone();
        let profile = if self.cfg.coverage < 1.0 {
            profile.typical(self.cfg.coverage)
        } else {
            profile
        };
        self.restricted.clear();
        let demand: f64 = profile
            .classes()
            .iter()
            .map(|(c, w)| w * c.gpu_demand())
            .sum();
        for (c, w) in profile.classes() {
            if !c.gpu_models.is_empty() && demand > 0.0 {
                *self.restricted.entry(c.gpu_models.clone()).or_insert(0.0) +=
                    w * c.gpu_demand() / demand;
            }
        }
        let restricted = &self.restricted;
        self.scarcity.retain(|set, _| restricted.contains_key(set));
        let sets: Vec<Vec<String>> = if self.cfg.pressure_by_demand {
            self.restricted.keys().cloned().collect()
        } else {
            Vec::new()
        };
        // the part of the class weight each class keeps (pressure, GPU
        // demand or 1); the weights are normalised by the mix
        let factor = |c: &PodClass| self.class_factor(c);
        if sets.is_empty() {
            // one part: normalised as a profile is, with the squash scale
            // of `mix` (kept apart so its figures stay bit for bit)
            let mut scale = self.cfg.quantize_scale;
            let weighted = match self.cfg.class_weight {
                ClassWeight::Pods => profile.clone(),
                ClassWeight::Pressure => {
                    let z: f64 = profile.classes().iter().map(|(c, w)| w * factor(c)).sum();
                    if z > 0.0 && z.is_finite() {
                        scale /= z;
                    }
                    profile.reweighted(factor)
                }
                ClassWeight::Gpu | ClassWeight::GpuPressure => profile.reweighted(factor),
            };
            self.parts.clear();
            self.part_sets.clear();
            self.engine = FragEngine::grouped(weighted.clone(), scale)
                .with_size_exponent(self.cfg.size_exponent)
                .with_cpu_only_round_up(self.cfg.cpu_only_round_up);
            return self;
        }
        // parts of the mixed engine: 0 the unrestricted classes; per
        // restricted model set S, its classes without the restriction
        // (coefficient 1 − ℓ_S) and with it (ℓ_S)
        let mut parts: Vec<Vec<(PodClass, f64)>> = vec![Vec::new(); 1 + 2 * sets.len()];
        for (c, w) in profile.classes() {
            let Ok(i) = sets.binary_search(&c.gpu_models) else {
                parts[0].push((c.clone(), w * factor(c)));
                continue;
            };
            let free = PodClass {
                gpu_models: Vec::new(),
                ..c.clone()
            };
            let wf = w * factor(&free);
            parts[1 + 2 * i].push((free, wf));
            parts[2 + 2 * i].push((c.clone(), w * factor(c)));
        }
        self.parts = parts.into_iter().map(Profile::from_weights).collect();
        self.part_sets = sets;
        let (coef, scale) = self.mix();
        self.engine = FragEngine::mixed(&self.parts, &coef, scale)
            .with_size_exponent(self.cfg.size_exponent)
            .with_cpu_only_round_up(self.cfg.cpu_only_round_up);
        self
    }

    /// What a class weighs relative to its share of the pods
    /// ([`GpuschedConfig::class_weight`]).
    fn class_factor(&self, c: &PodClass) -> f64 {
        let by_gpu = match self.cfg.class_weight {
            ClassWeight::Pods => return 1.0,
            ClassWeight::Gpu => return c.gpu_demand(),
            ClassWeight::Pressure => false,
            ClassWeight::GpuPressure => true,
        };
        let total = self.reach.values().sum::<u64>().max(1);
        let reach: u64 = if c.gpu_models.is_empty() {
            total
        } else {
            c.gpu_models
                .iter()
                .map(|m| self.reach.get(m).copied().unwrap_or(0))
                .sum()
        };
        // a class that can reach no GPU of the cluster cannot be helped by
        // placement: it keeps its own weight
        let capacity_share = reach.clamp(1, total) as f64 / total as f64;
        let pressure = 1.0 / capacity_share;
        if by_gpu {
            c.gpu_demand() * pressure
        } else {
            pressure
        }
    }

    /// The coefficients of the engine's parts and its squash scale for the
    /// current scarcity levels: part weights are normalised to sum 1 (as a
    /// profile is); with pressure weights the squash scale shrinks by the
    /// same factor, so unrestricted classes keep the units of pod weights.
    fn mix(&self) -> (Vec<f64>, f64) {
        let mut coef = vec![1.0; self.parts.len()];
        for (i, set) in self.part_sets.iter().enumerate() {
            let l = self.scarcity.get(set).copied().unwrap_or(LEVELS) as f64 / LEVELS as f64;
            coef[1 + 2 * i] = 1.0 - l;
            coef[2 + 2 * i] = l;
        }
        let z: f64 = self
            .parts
            .iter()
            .zip(&coef)
            .map(|(p, k)| k * p.classes().iter().map(|(_, w)| w).sum::<f64>())
            .sum();
        let z = if z > 0.0 && z.is_finite() { z } else { 1.0 };
        for k in &mut coef {
            *k /= z;
        }
        let scale = if self.cfg.class_weight == ClassWeight::Pressure {
            self.cfg.quantize_scale / z
        } else {
            self.cfg.quantize_scale
        };
        (coef, scale)
    }

    /// The policy with the knobs `cfg` (the engine is rebuilt).
    pub fn with_config(mut self, cfg: GpuschedConfig) -> Self {
        self.cfg = cfg;
        let p = self.source.clone();
        self.with_engine(p)
    }

    /// The knobs in effect.
    pub fn config(&self) -> &GpuschedConfig {
        &self.cfg
    }

    /// The primary key of a placement whose fragmentation change is
    /// `(Δ, squashed Δ)`: the engine squashes `Δ` with the pod's scale
    /// (`s·gᵃ`) once per node state; unquantized, `⌊Δ⌋`.
    #[inline]
    fn primary(&self, (delta, squashed): (f64, i64)) -> i64 {
        if self.cfg.quantize {
            squashed
        } else {
            delta.floor() as i64
        }
    }

    /// The tie key of placing a pod on `node` (the same for every GPU of
    /// the node a share may take): the node-size order.
    #[inline]
    fn tie(&self, state: &ClusterState<'_>, node: NodeId) -> i64 {
        let g = state.node(node).gpus.len().min(255) as i64;
        match self.cfg.size_order {
            SizeOrder::FewerFirst => 255 - g,
            SizeOrder::MoreFirst => g,
            SizeOrder::LargestLast => (g < self.largest as i64) as i64,
            SizeOrder::None => 0,
        }
    }

    /// Moves the [`scarcity_level`] of every restricted model set to
    /// `state` (with the hysteresis of [`next_level`]); whether one moved.
    /// Once per decision in the FGD method: no allocation unless a level
    /// is new.
    fn update_scarcity(&mut self, state: &ClusterState<'_>) -> bool {
        // one model per node, as the fragmentation engine reads it; kept
        // per model by the state, so a decision does not sum every node
        let free_by_model = state.free_gpu_milli_by_model();
        let total: u64 = free_by_model.iter().sum();
        let names = state.model_names();
        let mut moved = false;
        for (set, &q) in &self.restricted {
            let on_set: u64 = set
                .iter()
                .filter_map(|m| names.iter().position(|n| n == m))
                .map(|k| free_by_model[k])
                .sum();
            let raw = scarcity_raw(q, total, on_set, self.cfg.scarcity_exponent);
            match self.scarcity.get_mut(set) {
                Some(level) => {
                    let next = next_level(*level, raw);
                    moved |= next != *level;
                    *level = next;
                }
                None => {
                    let next = next_level(LEVELS, raw);
                    // an absent level reads as full
                    moved |= next != LEVELS;
                    self.scarcity.insert(set.clone(), next);
                }
            }
        }
        moved
    }
}

impl Packer for GpuschedPacker {
    fn name(&self) -> &'static str {
        super::names::PolicyName::Gpusched.as_str()
    }

    fn prepare(&mut self, env: &PackEnv<'_, '_>) {
        let generation = self.generation;
        // whether `place` may answer differently from before this call
        let mut changed = false;
        let mut rebuild = None;
        // a level moved: new coefficients for the engine's parts, its memo
        // of each part's fragmentation kept
        let mut remix = false;
        if self.shape_nodes != env.snapshot.nodes.len() {
            // GPUs per model and the largest node size, in one pass;
            // recounted when the node count changes
            let mut reach = std::collections::BTreeMap::new();
            let mut largest = 0;
            for n in &env.snapshot.nodes {
                largest = largest.max(n.gpus.len().min(255) as u32);
                for g in n.gpus.iter().filter(|g| g.is_healthy()) {
                    *reach.entry(g.model.clone()).or_insert(0u64) += 1;
                }
            }
            changed |= self.largest != largest;
            self.largest = largest;
            self.shape_nodes = env.snapshot.nodes.len();
            if reach != self.reach {
                self.reach = reach;
                if matches!(
                    self.cfg.class_weight,
                    ClassWeight::Pressure | ClassWeight::GpuPressure
                ) {
                    rebuild = Some(self.source.clone());
                }
            }
        }
        if self.cfg.pressure_by_demand
            && matches!(
                self.cfg.class_weight,
                ClassWeight::Pressure | ClassWeight::GpuPressure
            )
            && !self.restricted.is_empty()
        {
            remix = self.update_scarcity(env.state);
        }
        if !self.explicit {
            let p = derive_profile_kept(&mut self.class_counts, env);
            if p != self.source {
                rebuild = Some(p);
            }
        }
        changed |= remix || rebuild.is_some();
        if let Some(p) = rebuild {
            let this = std::mem::take(self);
            *self = GpuschedPacker {
                cfg: this.cfg,
                reach: this.reach,
                largest: this.largest,
                shape_nodes: this.shape_nodes,
                scarcity: this.scarcity,
                explicit: this.explicit,
                class_counts: this.class_counts,
                ..GpuschedPacker::new()
            }
            .with_engine(p);
        } else if remix {
            // levels exist only for restricted sets: the engine is mixed
            let (coef, scale) = self.mix();
            self.engine.set_mix(&coef, scale);
        }
        self.generation = generation + changed as u64;
    }

    /// Bumped by `prepare` when an engine rebuild, new scarcity levels or
    /// a new largest node size change what `place` answers.
    fn generation(&self) -> Option<u64> {
        Some(self.generation)
    }

    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        let tie = self.tie(state, node);
        match pod.gpu {
            GpuRequest::Share { .. } => self.engine.with_eval(pod, node, state, |e| {
                // the tie key is the node's: compared per GPU are the
                // primary key, then the fuller GPU
                let mut best: Option<(i64, u32, usize, u32)> = None;
                for_each_share(state, pod, node, |g, m, free| {
                    let Some(d) = e.for_left(free) else { return };
                    let left = free - m;
                    let k = self.primary(d);
                    if best.is_none_or(|(bk, bl, _, _)| k > bk || (k == bk && left < bl)) {
                        best = Some((k, left, g, m));
                    }
                });
                best.map(|(primary, _, g, m)| Placement {
                    score: Score::keys(primary, 0, tie),
                    gpus: share_on(pod, g, m),
                })
            }),
            _ => {
                let gpus = self.whole.assignment(state, pod, node, || None)?;
                let d = self.engine.with_eval(pod, node, state, |e| e.first())?;
                Some(Placement {
                    score: Score::keys(self.primary(d), 0, tie),
                    gpus,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::profile::PodClass;
    use gpusched_core::{GpuAssignment, Snapshot};
    use gpusched_testkit::packing::*;

    fn profile() -> Profile {
        let c = |milli, count| PodClass {
            cpu_milli: 1000,
            gpu_milli: milli,
            gpu_count: count,
            gpu_mem_mib: 0,
            gpu_models: vec![],
        };
        Profile::new([(c(500, 1), 0.9), (c(1000, 8), 0.1)])
    }

    #[test]
    fn avoids_fragments_and_keeps_rare_classes() {
        // node a: 8 GPUs, empty; node b: 8 GPUs, one half-used GPU
        let nodes = vec![node("a", 8, 96_000, "G2"), node("b", 8, 96_000, "G2")];
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 1, 3, 500, 0);
        let p = GpuschedPacker::with_profile(profile());
        // a 0.5 share completes b's GPU 3 and keeps node a whole for the
        // 8-GPU class (which the reference's 95 % cut would drop)
        let (n, pl) = pick(&p, &pod(1000, share(500)), &cs).unwrap();
        assert_eq!(n, 1);
        assert_eq!(
            pl.gpus,
            GpuAssignment::Share {
                gpu: 3,
                milli: 500,
                memory_mib: 0
            }
        );
        // an 8-GPU pod only fits on a
        let (n, _) = pick(&p, &pod(1000, GpuRequest::Whole(8)), &cs).unwrap();
        assert_eq!(n, 0);
    }

    #[test]
    fn scarcity_levels() {
        // ρ = 0.1 · 10000 / 2000 = 0.5
        assert_eq!(scarcity_level(0.1, 10_000, 2000, 1.0), LEVELS / 2);
        assert_eq!(scarcity_level(0.1, 10_000, 2000, 8.0), 0);
        // ρ ≥ 1 and a set without free GPUs: full
        assert_eq!(scarcity_level(0.3, 10_000, 2000, 8.0), LEVELS);
        assert_eq!(scarcity_level(0.01, 10_000, 0, 8.0), LEVELS);
        assert_eq!(scarcity_level(0.0, 10_000, 2000, 8.0), 0);
        // hysteresis: a level moves only a whole step away
        assert_eq!(next_level(8, 8.9), 8);
        assert_eq!(next_level(8, 7.2), 8);
        assert_eq!(next_level(8, 9.0), 9);
        assert_eq!(next_level(16, 0.3), 0);
    }

    #[test]
    fn scarce_models_are_kept_only_while_their_restricted_demand_binds() {
        // a: model X, 2 GPUs; b: model Y, 2 GPUs; c: model Y, 16 GPUs
        let nodes = vec![
            node("a", 2, 64_000, "X"),
            node("b", 2, 64_000, "Y"),
            node("c", 16, 256_000, "Y"),
        ];
        let snap = Snapshot {
            nodes: nodes.clone(),
            ..Default::default()
        };
        let one = |models: Vec<String>| PodClass {
            cpu_milli: 1000,
            gpu_milli: 1000,
            gpu_count: 1,
            gpu_mem_mib: 0,
            gpu_models: models,
        };
        // 30 % of the GPU demand may only use X (10 % of the GPUs)
        let prof = Profile::new([(one(vec![]), 0.7), (one(vec!["X".into()]), 0.3)]);
        let p1 = pod(1000, GpuRequest::Whole(1));
        let mut cs = ClusterState::new(&nodes);
        let mut p = GpuschedPacker::with_profile(prof.clone());
        // ρ_X = 0.3 · 20000 / 2000 = 3: X is kept for its pods
        prepare(&mut p, &snap, &cs, 0);
        assert_eq!(pick(&p, &p1, &cs).unwrap().0, 1);
        // c full: ρ_X = 0.3 · 4000 / 2000 = 0.6, X has room to spare and
        // the tie goes to the node order
        for g in 0..16 {
            take(&mut cs, 2, g, 1000, 0);
        }
        prepare(&mut p, &snap, &cs, 1);
        assert_eq!(pick(&p, &p1, &cs).unwrap().0, 0);
        // the static pressure keeps X free regardless
        let mut fixed = GpuschedPacker::with_profile(prof).with_config(GpuschedConfig {
            pressure_by_demand: false,
            ..Default::default()
        });
        prepare(&mut fixed, &snap, &cs, 1);
        assert_eq!(pick(&fixed, &p1, &cs).unwrap().0, 1);
    }

    #[test]
    fn the_largest_nodes_go_last_and_the_others_in_node_order() {
        // a 1-GPU pod on an empty node: the same Δ on every node (no class
        // of the profile needs more than one GPU)
        let nodes = vec![
            node("eight-a", 8, 96_000, "G2"),
            node("four", 4, 96_000, "G2"),
            node("two", 2, 96_000, "G2"),
            node("eight-b", 8, 96_000, "G2"),
        ];
        let snap = Snapshot {
            nodes: nodes.clone(),
            ..Default::default()
        };
        let one = PodClass {
            cpu_milli: 1000,
            gpu_milli: 1000,
            gpu_count: 1,
            gpu_mem_mib: 0,
            gpu_models: vec![],
        };
        let prof = Profile::new([(one, 1.0)]);
        let p1 = pod(1000, GpuRequest::Whole(1));
        let cs = ClusterState::new(&nodes);
        let with = |order| {
            let mut p = GpuschedPacker::with_profile(prof.clone()).with_config(GpuschedConfig {
                size_order: order,
                ..Default::default()
            });
            prepare(&mut p, &snap, &cs, 0);
            pick(&p, &p1, &cs).unwrap().0
        };
        // the default: the 8-GPU nodes last, the 4- before the 2-GPU node
        // by node order
        assert_eq!(GpuschedConfig::default().size_order, SizeOrder::LargestLast);
        assert_eq!(with(SizeOrder::LargestLast), 1);
        assert_eq!(with(SizeOrder::FewerFirst), 2);
        assert_eq!(with(SizeOrder::MoreFirst), 0);
        assert_eq!(with(SizeOrder::None), 0);
        // with only 8-GPU nodes left, the node order decides
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 1, 0, 1000, 0);
        take(&mut cs, 1, 1, 1000, 0);
        take(&mut cs, 1, 2, 1000, 0);
        take(&mut cs, 1, 3, 1000, 0);
        take(&mut cs, 2, 0, 1000, 0);
        take(&mut cs, 2, 1, 1000, 0);
        let mut p = GpuschedPacker::with_profile(prof.clone());
        prepare(&mut p, &snap, &cs, 0);
        assert_eq!(pick(&p, &p1, &cs).unwrap().0, 0);
    }

    #[test]
    fn a_cpu_only_pod_ties_a_small_fragment_change_with_none() {
        // a: 8 GPUs, 96 CPU; b: 8 GPUs, 200 CPU. A CPU-only pod of 2 CPU
        // leaves a with 94 CPU, too few for the rare 95-CPU class: all 8
        // free GPUs of a become its fragment, Δ = −w·8000. On b nothing
        // changes (Δ = 0).
        let nodes = vec![node("a", 8, 96_000, "G2"), node("b", 8, 200_000, "G2")];
        let snap = Snapshot {
            nodes: nodes.clone(),
            ..Default::default()
        };
        let class = |cpu_milli| PodClass {
            cpu_milli,
            gpu_milli: 1000,
            gpu_count: 1,
            gpu_mem_mib: 0,
            gpu_models: vec![],
        };
        let cs = ClusterState::new(&nodes);
        let cpu_only = pod(2000, GpuRequest::None);
        let with = |rare: f64, up: bool| {
            let prof = Profile::new([(class(1000), 1.0 - rare), (class(95_000), rare)]);
            let mut p = GpuschedPacker::with_profile(prof).with_config(GpuschedConfig {
                cpu_only_round_up: up,
                ..Default::default()
            });
            prepare(&mut p, &snap, &cs, 0);
            pick(&p, &cpu_only, &cs).unwrap().0
        };
        assert!(GpuschedConfig::default().cpu_only_round_up);
        // w = 0.005: Δ = −40, under one step of the squash (≈ 100 milli
        // at 2500·1): a and b tie and the node order takes a; rounded down
        // the 40 milli cost a whole step and b wins
        assert_eq!(with(0.005, true), 0);
        assert_eq!(with(0.005, false), 1);
        // w = 0.05: Δ = −400, several steps: b either way
        assert_eq!(with(0.05, true), 1);
        assert_eq!(with(0.05, false), 1);
    }
}
