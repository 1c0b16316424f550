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
//! `L` the node's free GPU milli after placing, `λ` =
//! [`GpuschedConfig::pack_weight`], `s` = [`GpuschedConfig::quantize_scale`],
//! `a` = [`GpuschedConfig::size_exponent`] and `g` the pod's GPU demand in
//! GPUs (`k` whole GPUs, a share's fraction, at least 0.05; 1 for a
//! CPU-only pod):
//!
//! ```text
//! w_c     = p_c · π_c,  π_c = cluster GPUs / GPUs of the models c may use
//! F(n)    = Σ_c w_c · f_c(n)           (f_c: FGD's fragment of n for c)
//! v       = Δ − λ · L
//! primary = ⌊100 · sigmoid(v / (s · gᵃ))⌋     (quantize; else ⌊v⌋;
//!           ⌈…⌉ for a CPU-only pod, see below)
//! score   = (primary, secondary, tie), compared in that order
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
//! `secondary` is an optional bin-packing key (sum of squares over GPU fill
//! levels, or the expected waste of the leftover); `tie` puts the
//! cluster's largest nodes last ([`GpuschedConfig::size_order`]) or,
//! optionally, the fuller node or the least contested model. What is left
//! equal falls to the node order (the core: lowest node id), i.e. first
//! fit among placements of nearly equal fragmentation. Defaults (measured on the openb trace and
//! its variants, see `docs/placement.md`): full distribution, pressure
//! weights, `s = 2500`, `a = 1` (the squash scales with the pod: a small
//! share's `Δ` is small, so its near-equal placements tie and go first
//! fit, while an 8-GPU pod's large `Δ` is still told apart), `λ = 0`, no
//! secondary key, largest nodes last. A share goes on the GPU with the
//! best score, then the least compute left.
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

use super::fgd::{FragEngine, derive_profile};
use super::profile::{PodClass, Profile};
use super::util::{WholeChooser, cpu_left_after, for_each_share, share_on};
use gpusched_core::{ClusterState, NodeId, PackEnv, Packer, Placement, Score};
use gpusched_model::{GPU_MILLI, GpuRequest, Pod};

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
    /// Weight `λ` of the node's free GPU milli after placing.
    pub pack_weight: f64,
    /// Break ties by the fuller node (GPU, then CPU); else leave them.
    pub best_fit_tie: bool,
    /// Second key: the sum-of-squares rule of online bin packing over the
    /// cluster's partially used GPUs (prefer fill levels that are rare).
    pub sum_of_squares: bool,
    /// Second key: the expected waste of the chosen GPU's leftover under
    /// the workload's share sizes (see [`expected_waste`]).
    pub waste_key: bool,
    /// Node-size preference among equal scores (when `best_fit_tie` is
    /// off); what is left equal goes to the node order.
    pub size_order: SizeOrder,
    /// Share of the workload's pods whose classes count (1.0: all; the
    /// reference FGD uses 0.95).
    pub coverage: f64,
    /// Weight `κ` of a penalty on fully free GPUs left without the CPU a
    /// typical whole-GPU pod needs (GPU-milli per stranded GPU).
    pub cpu_reserve: f64,
    /// How the pod classes of the target workload are weighted in the
    /// expected fragmentation.
    pub class_weight: ClassWeight,
    /// Among equal scores, first the node whose GPU model the fewest pod
    /// classes may use (total class weight, [`FragEngine::allowed_weight`]),
    /// then the size order: capacity that restricted pods need is spent
    /// last. Without restricted classes every node weighs the same.
    pub least_contested_first: bool,
    /// Pressure of a restricted class from the load on its models:
    /// `π_c = 1 + (pod share of the classes with c's model set) / (their
    /// share of the cluster's GPUs)` instead of `1 / share`.
    pub pressure_by_load: bool,
    /// Count a model restriction only as far as it binds: a class
    /// restricted to the model set `S` is split into an unrestricted twin
    /// of weight `p_c·(1 − ℓ_S)` and the restricted class of weight
    /// `p_c·ℓ_S` (then pressure-weighted), with `ℓ_S` the scarcity level of
    /// `S` ([`scarcity_level`]). Off: `ℓ_S = 1`.
    pub pressure_by_demand: bool,
    /// Exponent `k` of the scarcity level `ℓ_S = min(1, ρ_S)ᵏ` (large:
    /// a step at `ρ_S = 1`).
    pub scarcity_exponent: f64,
    /// With `size_order: fewer-first`: order ties by the node-size
    /// protection `P(n) = Σ_{t ≤ size(n)} ℓ_t` instead of the size itself, where `ℓ_t`
    /// is the scarcity level of the node-size threshold `t` (see
    /// [`size_levels`]): a node size is kept for the pods that need it
    /// only as far as their demand binds the free whole GPUs there. Off:
    /// every `ℓ_t = 1` (fewer GPUs first). Off by default: on the openb
    /// variants it acts as the plain node order (see `docs/placement.md`).
    pub size_by_demand: bool,
    /// Exponent `k` of the size level `ℓ_t = min(1, ρ_t)ᵏ`. As a tie key
    /// only `ℓ_t > 0` matters (levels are summed, then compared): a
    /// threshold is protected from `ρ_t ≥ (1/(2·LEVELS))^(1/k)` (k = 8:
    /// 0.65).
    pub size_level_exponent: f64,
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
        let checks: [Check; 7] = [
            ("quantize_scale", self.quantize_scale, |v| v > 0.0, "> 0"),
            ("size_exponent", self.size_exponent, |v| v >= 0.0, ">= 0"),
            ("pack_weight", self.pack_weight, |v| v >= 0.0, ">= 0"),
            (
                "coverage",
                self.coverage,
                |v| v > 0.0 && v <= 1.0,
                "in (0, 1]",
            ),
            ("cpu_reserve", self.cpu_reserve, |v| v >= 0.0, ">= 0"),
            (
                "scarcity_exponent",
                self.scarcity_exponent,
                |v| v > 0.0,
                "> 0",
            ),
            (
                "size_level_exponent",
                self.size_level_exponent,
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
            pack_weight: 0.0,
            best_fit_tie: false,
            sum_of_squares: false,
            waste_key: false,
            size_order: SizeOrder::LargestLast,
            coverage: 1.0,
            cpu_reserve: 0.0,
            class_weight: ClassWeight::Pressure,
            least_contested_first: false,
            pressure_by_load: false,
            pressure_by_demand: true,
            scarcity_exponent: 8.0,
            size_by_demand: false,
            size_level_exponent: 8.0,
        }
    }
}

/// Our default packing policy (see the module documentation).
pub struct GpuschedPacker {
    explicit: bool,
    cfg: GpuschedConfig,
    engine: FragEngine,
    whole: WholeChooser,
    /// Partially used GPUs per free milli (sum-of-squares rule).
    levels: Vec<u32>,
    /// Expected waste per free milli (0..=1000).
    waste: Vec<f64>,
    /// The target workload as given (before the coverage cut).
    source: Profile,
    /// Mean CPU (milli) per GPU of the workload's whole-GPU classes.
    cpu_per_gpu: f64,
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
    /// Level `ℓ_t` per node-size threshold `t` ([`size_levels`]), ascending.
    size_levels: Vec<(u32, u32)>,
    /// Tie protection `P` per node size (index: GPUs of the node; sizes
    /// above the table take its last entry).
    size_protection: Vec<u32>,
    /// The parts of the engine's mixed profile (see `with_engine`).
    parts: Vec<Profile>,
    /// The restricted model set of each pair of parts after the first.
    part_sets: Vec<Vec<String>>,
    /// Bumped when `prepare` changes anything `place` reads
    /// ([`Packer::generation`]).
    generation: u64,
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

/// Scarcity level `ℓ_t` of every node-size threshold of `state`, as
/// `(t, ℓ_t)` ascending in `t`.
///
/// With `s_0 < s_1 < …` the distinct GPU counts of the nodes, a pod needing
/// `k > s_{i-1}` whole GPUs can only run on nodes of size `t = s_i` or
/// more: a *node-size restriction*. As for a model restriction
/// ([`scarcity_level`]), `ρ_t = q_t·U/R_t` with `q_t` the share of the
/// workload's GPU demand from classes needing more than `s_{i-1}` GPUs,
/// `U` the cluster's free GPU milli and `R_t` the free milli in *whole*
/// GPUs (the only ones such a pod can take) on nodes of size `≥ t`.
/// `ℓ_t = min(1, ρ_t)ᵏ` in steps of 1/[`LEVELS`], moved with the
/// hysteresis of [`next_level`] from `prev`; no such demand: 0. Shares
/// and CPU-only pods restrict nothing. One pass over the nodes and one
/// over the classes per threshold.
pub fn size_levels(
    state: &ClusterState<'_>,
    profile: &Profile,
    prev: &[(u32, u32)],
    exponent: f64,
) -> Vec<(u32, u32)> {
    // (size, free whole GPUs on nodes of that size)
    let mut by_size: Vec<(u32, u64)> = Vec::new();
    let mut total = 0u64;
    for (i, st) in state.states().iter().enumerate() {
        let size = state.node(i as NodeId).gpus.len() as u32;
        if size == 0 {
            continue;
        }
        total += st.free.gpu_milli;
        let w = st.whole_free();
        match by_size.iter_mut().find(|(s, _)| *s == size) {
            Some((_, v)) => *v += w as u64,
            None => by_size.push((size, w as u64)),
        }
    }
    by_size.sort_unstable();
    if by_size.len() < 2 {
        return Vec::new();
    }
    let demand: f64 = profile
        .classes()
        .iter()
        .map(|(c, w)| w * c.gpu_demand())
        .sum();
    let share_from = |k: u32| -> f64 {
        if demand <= 0.0 {
            return 0.0;
        }
        profile
            .classes()
            .iter()
            .filter(|(c, _)| c.gpu_count >= k)
            .map(|(c, w)| w * c.gpu_demand())
            .sum::<f64>()
            / demand
    };
    let mut out = Vec::with_capacity(by_size.len() - 1);
    for i in 1..by_size.len() {
        let (below, t) = (by_size[i - 1].0, by_size[i].0);
        let q = share_from(below + 1);
        let whole: u64 = by_size[i..].iter().map(|(_, v)| v).sum();
        let raw = if q > 0.0 {
            scarcity_raw(q, total, whole * GPU_MILLI, exponent)
        } else {
            0.0
        };
        let current = prev
            .iter()
            .find(|(s, _)| *s == t)
            .map_or(LEVELS, |(_, l)| *l);
        out.push((t, next_level(current, raw)));
    }
    out
}

/// Protection `P(s) = Σ_{t ≤ s} ℓ_t` per node size `s` (index), from
/// [`size_levels`]: with every `ℓ_t` full it orders the sizes like "fewer
/// GPUs first", with every `ℓ_t = 0` every node is equal (node order).
pub fn size_protection(levels: &[(u32, u32)]) -> Vec<u32> {
    let Some(&(max, _)) = levels.last() else {
        return Vec::new();
    };
    (0..=max)
        .map(|s| levels.iter().filter(|(t, _)| *t <= s).map(|(_, l)| l).sum())
        .collect()
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
            levels: Vec::new(),
            waste: Vec::new(),
            source: Profile::default(),
            cpu_per_gpu: 0.0,
            reach: Default::default(),
            largest: 0,
            shape_nodes: usize::MAX,
            scarcity: Default::default(),
            restricted: Default::default(),
            size_levels: Vec::new(),
            size_protection: Vec::new(),
            parts: Vec::new(),
            part_sets: Vec::new(),
            generation: 0,
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
        let factor = |c: &PodClass| self.class_factor(c, &profile);
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
            (self.waste, self.cpu_per_gpu) =
                derived_tables(&self.cfg, std::slice::from_ref(&weighted), &[1.0]);
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
        (self.waste, self.cpu_per_gpu) = derived_tables(&self.cfg, &self.parts, &coef);
        self
    }

    /// What a class of `profile` weighs relative to its share of the pods
    /// ([`GpuschedConfig::class_weight`]).
    fn class_factor(&self, c: &PodClass, profile: &Profile) -> f64 {
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
        let pressure = if self.cfg.pressure_by_load && !c.gpu_models.is_empty() {
            let load: f64 = profile
                .classes()
                .iter()
                .filter(|(o, _)| o.gpu_models == c.gpu_models)
                .map(|(_, w)| w)
                .sum();
            1.0 + load / capacity_share
        } else {
            1.0 / capacity_share
        };
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

    /// The primary and secondary keys of a placement whose fragmentation
    /// change is `(Δ, squashed Δ)` and bin-packing change `dss`, leaving
    /// `gpu_left` free GPU milli on `node`.
    #[inline]
    fn keys(
        &self,
        (delta, squashed): (f64, i64),
        dss: i64,
        state: &ClusterState<'_>,
        pod: &Pod,
        node: NodeId,
        gpu_left: u64,
    ) -> (i64, i64) {
        let secondary = if self.cfg.sum_of_squares || self.cfg.waste_key {
            (1 << 19) - dss.clamp(-(1 << 19), (1 << 19) - 1)
        } else {
            0
        };
        if self.cfg.quantize && self.cfg.pack_weight == 0.0 && self.cfg.cpu_reserve <= 0.0 {
            // the engine squashes Δ with this pod's scale (s·gᵃ) once per
            // node state
            return (squashed, secondary);
        }
        let mut value = delta - self.cfg.pack_weight * gpu_left as f64;
        if self.cfg.cpu_reserve > 0.0 && self.cpu_per_gpu > 0.0 {
            value -= self.cfg.cpu_reserve * self.stranded(state, pod, node, gpu_left);
        }
        let primary = if !self.cfg.quantize {
            value.floor() as i64
        } else if value == delta {
            squashed
        } else {
            self.engine.squash(pod, value)
        };
        (primary, secondary)
    }

    /// The tie key of placing `pod` on `node`, leaving `gpu_left` free GPU
    /// milli there (the same for every GPU of the node a share may take).
    #[inline]
    fn tie(
        &self,
        state: &ClusterState<'_>,
        pod: &Pod,
        node: NodeId,
        gpu_left: u64,
        contest: i64,
    ) -> i64 {
        if self.cfg.best_fit_tie {
            let cap = state.node(node).allocatable.cpu_milli.max(1);
            let cpu_used_ppm = 1_000_000
                - (cpu_left_after(state, pod, node) as u128 * 1_000_000 / cap as u128) as i64;
            let gcap = state.node(node).allocatable.gpu_milli.max(1);
            let gpu_used_ppm =
                1_000_000 - (gpu_left.min(gcap) as u128 * 1_000_000 / gcap as u128) as i64;
            (gpu_used_ppm / 100) * 256 + cpu_used_ppm / 4000
        } else {
            let g = state.node(node).gpus.len().min(255) as i64;
            let size = match self.cfg.size_order {
                SizeOrder::FewerFirst if self.cfg.size_by_demand => {
                    let p = self
                        .size_protection
                        .get(g as usize)
                        .or(self.size_protection.last())
                        .copied()
                        .unwrap_or(0);
                    255 - (p as i64).min(255)
                }
                SizeOrder::FewerFirst => 255 - g,
                SizeOrder::MoreFirst => g,
                SizeOrder::LargestLast => (g < self.largest as i64) as i64,
                SizeOrder::None => 0,
            };
            contest * 256 + size
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

    /// Tie key of [`GpuschedConfig::least_contested_first`] (higher: less
    /// contested). Must not be called inside `engine.with_eval`.
    #[inline]
    fn contest(&self, state: &ClusterState<'_>, node: NodeId) -> i64 {
        if !self.cfg.least_contested_first || self.cfg.best_fit_tie {
            return 0;
        }
        let w = self.engine.allowed_weight(state, node).clamp(0.0, 1.0);
        10_000 - (w * 10_000.0).round() as i64
    }

    /// Fully free GPUs (after placing) that the node's CPU left cannot feed
    /// at the workload's mean CPU per GPU, in milli-GPU.
    fn stranded(&self, state: &ClusterState<'_>, pod: &Pod, node: NodeId, _gpu_left: u64) -> f64 {
        let mut full = state.get(node).whole_free() as f64;
        // a share may take a free GPU too; counted conservatively as not
        if let GpuRequest::Whole(k) = pod.gpu {
            full -= k as f64;
        }
        let cpu = cpu_left_after(state, pod, node) as f64;
        let feedable = (cpu / self.cpu_per_gpu).floor();
        (full - feedable).max(0.0) * 1000.0
    }

    /// Change of `Σ_h N(h)²` over partially used GPUs (N(h): GPUs with `h`
    /// milli free, 0 < h < 1000) when one GPU goes from `free` to `left`.
    #[inline]
    fn dss(&self, free: u32, left: u32) -> i64 {
        if self.cfg.waste_key {
            let w = |h: u32| self.waste.get(h as usize).copied().unwrap_or(h as f64);
            return (w(left) - w(free)).round() as i64;
        }
        if !self.cfg.sum_of_squares {
            return 0;
        }
        let n = |h: u32| self.levels.get(h as usize).copied().unwrap_or(0) as i64;
        let mut d = 0;
        if left > 0 && left < 1000 {
            d += 2 * n(left) + 1;
        }
        if free > 0 && free < 1000 {
            d += -2 * n(free) + 1;
        }
        d
    }
}

/// The tables read from the effective class weights (`parts` × `coef`):
/// the expected waste per free milli ([`GpuschedConfig::waste_key`]) and
/// the mean CPU per GPU of the whole-GPU classes
/// ([`GpuschedConfig::cpu_reserve`]); empty and 0 when neither knob is on.
fn derived_tables(cfg: &GpuschedConfig, parts: &[Profile], coef: &[f64]) -> (Vec<f64>, f64) {
    if !cfg.waste_key && cfg.cpu_reserve <= 0.0 {
        return (Vec::new(), 0.0);
    }
    let effective = Profile::from_weights(
        parts
            .iter()
            .zip(coef)
            .flat_map(|(p, k)| p.classes().iter().map(move |(c, w)| (c.clone(), w * k))),
    );
    let waste = if cfg.waste_key {
        expected_waste(&effective)
    } else {
        Vec::new()
    };
    let (mut num, mut den) = (0.0, 0.0);
    for (c, w) in effective.classes() {
        if c.gpu_milli as u64 == GPU_MILLI && c.gpu_count > 0 {
            num += w * c.cpu_milli as f64 / c.gpu_count as f64;
            den += w;
        }
    }
    (waste, if den > 0.0 { num / den } else { 0.0 })
}

/// Expected final free milli `W(h)` of a GPU with `h` milli free if future
/// pods keep landing on it, each class that fits with probability
/// proportional to its weight, until none fits: `W(h) = h` when no class
/// fits, else `Σ_c p_c·W(h − m_c) / Σ_c p_c` over the classes that fit
/// (whole-GPU classes fit only `h = 1000`, CPU-only classes never count).
pub fn expected_waste(profile: &Profile) -> Vec<f64> {
    let sizes: Vec<(u32, f64)> = profile
        .classes()
        .iter()
        .filter(|(c, _)| c.gpu_count == 1 && c.gpu_milli > 0)
        .map(|(c, w)| (c.gpu_milli.min(1000), *w))
        .collect();
    let mut w = vec![0.0f64; 1001];
    for h in 1..=1000u32 {
        let (mut num, mut den) = (0.0, 0.0);
        for &(m, p) in &sizes {
            if m <= h {
                num += p * w[(h - m) as usize];
                den += p;
            }
        }
        w[h as usize] = if den > 0.0 { num / den } else { h as f64 };
    }
    w
}

impl Packer for GpuschedPacker {
    fn name(&self) -> &'static str {
        super::PolicyName::Gpusched.as_str()
    }

    fn prepare(&mut self, env: &PackEnv<'_, '_>) {
        // kept across an engine rebuild (hysteresis of the size levels)
        let size_prev = std::mem::take(&mut self.size_levels);
        let protection_prev = self.size_protection.clone();
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
            let p = derive_profile(env);
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
                ..GpuschedPacker::new()
            }
            .with_engine(p);
        } else if remix {
            // levels exist only for restricted sets: the engine is mixed
            let (coef, scale) = self.mix();
            self.engine.set_mix(&coef, scale);
            (self.waste, self.cpu_per_gpu) = derived_tables(&self.cfg, &self.parts, &coef);
        }
        if self.cfg.size_by_demand
            && self.cfg.size_order == SizeOrder::FewerFirst
            && !self.cfg.best_fit_tie
        {
            self.size_levels = size_levels(
                env.state,
                &self.source,
                &size_prev,
                self.cfg.size_level_exponent,
            );
            self.size_protection = size_protection(&self.size_levels);
        }
        changed |= self.size_protection != protection_prev;
        if self.cfg.sum_of_squares {
            // the levels follow every placement
            changed = true;
            self.levels.clear();
            self.levels.resize(1001, 0);
            for st in env.state.states() {
                for (g, &f) in st.gpu_free_milli.iter().enumerate() {
                    if st.gpu_usable[g] && f > 0 && f < 1000 {
                        self.levels[f as usize] += 1;
                    }
                }
            }
        }
        self.generation = generation + changed as u64;
    }

    /// Bumped by `prepare` when an engine rebuild, new scarcity levels,
    /// node-size levels or bin levels change what `place` answers.
    fn generation(&self) -> Option<u64> {
        Some(self.generation)
    }

    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        let node_free = state.get(node).free.gpu_milli;
        let contest = self.contest(state, node);
        match pod.gpu {
            GpuRequest::Share { .. } => self.engine.with_eval(pod, node, state, |e| {
                // the tie key is the node's: compared per GPU are the
                // primary and secondary keys, then the fuller GPU
                let mut best: Option<((i64, i64), u32, usize, u32)> = None;
                for_each_share(state, pod, node, |g, m, free| {
                    let Some(d) = e.for_left(free) else { return };
                    let left = free - m;
                    let k = self.keys(
                        d,
                        self.dss(free, left),
                        state,
                        pod,
                        node,
                        node_free - m as u64,
                    );
                    if best.is_none_or(|(bk, bl, _, _)| k > bk || (k == bk && left < bl)) {
                        best = Some((k, left, g, m));
                    }
                });
                best.map(|((primary, secondary), _, g, m)| {
                    let tie = self.tie(state, pod, node, node_free - m as u64, contest);
                    Placement {
                        score: Score::keys(primary, secondary, tie),
                        gpus: share_on(pod, g, m),
                    }
                })
            }),
            _ => {
                let gpus = self.whole.assignment(state, pod, node, || None)?;
                let d = self.engine.with_eval(pod, node, state, |e| e.first())?;
                let left = node_free.saturating_sub(gpus.milli());
                let (primary, secondary) = self.keys(d, 0, state, pod, node, left);
                let tie = self.tie(state, pod, node, left, contest);
                Some(Placement {
                    score: Score::keys(primary, secondary, tie),
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
    fn size_protection_sums_the_levels_up_to_the_size() {
        // every level full: fewer GPUs first
        let full = size_protection(&[(2, LEVELS), (4, LEVELS), (8, LEVELS)]);
        assert_eq!(full[1], 0);
        assert_eq!(full[2], LEVELS);
        assert_eq!(full[3], LEVELS);
        assert_eq!(full[4], 2 * LEVELS);
        assert_eq!(full[8], 3 * LEVELS);
        // only 4 binds: 1- and 2-GPU nodes are equal, 4 and 8 too
        let four = size_protection(&[(2, 0), (4, 3), (8, 0)]);
        assert_eq!((four[1], four[2], four[4], four[8]), (0, 0, 3, 3));
        assert!(size_protection(&[]).is_empty());
    }

    #[test]
    fn node_sizes_are_kept_only_while_the_big_pod_demand_binds() {
        // big: 8 GPUs, 6 taken; small: 2 GPUs; spare: 16 GPUs
        let nodes = vec![
            node("big", 8, 96_000, "G2"),
            node("small", 2, 96_000, "G2"),
            node("spare", 16, 192_000, "G2"),
        ];
        let snap = Snapshot {
            nodes: nodes.clone(),
            ..Default::default()
        };
        let whole = |count| PodClass {
            cpu_milli: 1000,
            gpu_milli: 1000,
            gpu_count: count,
            gpu_mem_mib: 0,
            gpu_models: vec![],
        };
        // 3-GPU pods (they need a node of 8 or more): q = 0.6 / 1.4 = 0.43
        let prof = Profile::new([(whole(1), 0.8), (whole(3), 0.2)]);
        let p1 = pod(1000, GpuRequest::Whole(1));
        let mut cs = ClusterState::new(&nodes);
        for g in 0..6 {
            take(&mut cs, 0, g, 1000, 0);
        }
        let mut p = GpuschedPacker::with_profile(prof.clone()).with_config(GpuschedConfig {
            size_by_demand: true,
            size_order: SizeOrder::FewerFirst,
            ..Default::default()
        });
        let mut fixed = GpuschedPacker::with_profile(prof).with_config(GpuschedConfig {
            size_order: SizeOrder::FewerFirst,
            ..Default::default()
        });
        // ρ_8 = 0.43 · 20000 / 18000 = 0.48: the 3-GPU pods have room to
        // spare; big and small tie on Δ (neither can host a 3-GPU pod) and
        // the tie goes to the node order, where "fewer GPUs first" takes
        // small
        prepare(&mut p, &snap, &cs, 0);
        prepare(&mut fixed, &snap, &cs, 0);
        assert_eq!(p.size_levels, vec![(8, 0), (16, 0)]);
        assert_eq!(pick(&p, &p1, &cs).unwrap().0, 0);
        assert_eq!(pick(&fixed, &p1, &cs).unwrap().0, 1);
        // spare full: ρ_8 = 0.43 · 4000 / 2000 = 0.86, big's GPUs are
        // what the 3-GPU pods will need: small first
        for g in 0..16 {
            take(&mut cs, 2, g, 1000, 0);
        }
        prepare(&mut p, &snap, &cs, 1);
        assert!(p.size_levels[0].1 > 0, "{:?}", p.size_levels);
        assert_eq!(p.size_levels[1], (16, 0));
        assert_eq!(pick(&p, &p1, &cs).unwrap().0, 1);
        // without the knob the levels are not computed
        prepare(&mut fixed, &snap, &cs, 1);
        assert!(fixed.size_levels.is_empty());
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

    #[test]
    fn expected_waste_table() {
        let c = |milli| PodClass {
            cpu_milli: 1000,
            gpu_milli: milli,
            gpu_count: 1,
            gpu_mem_mib: 0,
            gpu_models: vec![],
        };
        // only half-GPU shares: 1000 -> 500 -> 0, 700 -> 200 left for good
        let w = expected_waste(&Profile::new([(c(500), 1.0)]));
        assert_eq!(w[1000], 0.0);
        assert_eq!(w[700], 200.0);
        assert_eq!(w[499], 499.0);
        // 0.8 and 0.2 shares, equally likely: 1000 ends at 0 either way;
        let w = expected_waste(&Profile::new([(c(800), 1.0), (c(200), 1.0)]));
        assert_eq!(w[1000], 0.0);
        // 900 always ends at 100 (800 fits once, or 200s down to 100)
        assert!((w[900] - 100.0).abs() < 1e-9, "{}", w[900]);
    }

    #[test]
    fn secondary_keys() {
        let nodes = vec![node("a", 2, 32_000, "T4"), node("b", 2, 32_000, "T4")];
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 1, 0, 1000, 0);
        let cfg = GpuschedConfig {
            quantize: false,
            best_fit_tie: true,
            sum_of_squares: true,
            ..Default::default()
        };
        let prof = Profile::new([(
            PodClass {
                cpu_milli: 1000,
                gpu_milli: 500,
                gpu_count: 1,
                gpu_mem_mib: 0,
                gpu_models: vec![],
            },
            1.0,
        )]);
        let mut p = GpuschedPacker::with_profile(prof).with_config(cfg);
        prepare(&mut p, &Snapshot::default(), &cs, 0);
        assert_eq!(p.config().quantize_scale, 2500.0);
        assert_eq!(p.config().size_exponent, 1.0);
        // Δ = 0 everywhere; best fit picks the fuller node b
        let (n, pl) = pick(&p, &pod(1000, share(500)), &cs).unwrap();
        assert_eq!(n, 1);
        assert!(matches!(pl.gpus, GpuAssignment::Share { gpu: 1, .. }));
    }
}
