//! Helpers shared by the packing policies: allocation-free GPU candidate
//! walks, the cached topology choice for whole GPUs, a small fast hasher
//! and a seeded mixing function.

use gpusched_core::state::share_milli;
use gpusched_core::{ClusterState, GpuAssignment, NodeId};
use gpusched_model::{GPU_MILLI, GpuRequest, Pod};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

/// A small multiplicative hasher (the rustc "Fx" scheme); keys here are
/// short tuples of integers built by us, never attacker-controlled.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.hash = (self.hash.rotate_left(5) ^ w).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.add(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // avalanche, so that hash tables indexing by the low bits see all
        // input bits
        mix64(self.hash)
    }
}

pub type FxBuild = BuildHasherDefault<FxHasher>;
pub type FxMap<K, V> = HashMap<K, V, FxBuild>;

pub use gpusched_model::mix::mix64;

/// GPU model of a node (its first GPU's), `""` for a node without GPUs.
pub fn node_model<'a>(state: &ClusterState<'a>, node: NodeId) -> &'a str {
    state.model_names()[state.model_index(node)]
}

/// Calls `f(gpu, effective milli, free milli)` for every GPU a share of
/// `pod` could go on, in position order (the same rule as
/// [`ClusterState::share_candidates`], without allocating).
#[inline]
pub fn for_each_share(
    state: &ClusterState<'_>,
    pod: &Pod,
    node: NodeId,
    mut f: impl FnMut(usize, u32, u32),
) {
    let GpuRequest::Share { milli, memory_mib } = pod.gpu else {
        return;
    };
    let st = state.get(node);
    let n = state.node(node);
    let any_gpu = unconstrained(pod);
    for g in 0..st.gpu_free_milli.len() {
        if !st.gpu_usable[g] || !(any_gpu || state.gpu_allowed(pod, node, g)) {
            continue;
        }
        let m = share_milli(milli, memory_mib, n.gpus[g].memory_mib);
        let free = st.gpu_free_milli[g];
        if m > 0 && free >= m && st.gpu_free_mem[g] >= memory_mib {
            f(g, m, free);
        }
    }
}

/// Whether every GPU is allowed for `pod` (no model, memory or DRA claim
/// constraint).
#[inline]
pub fn unconstrained(pod: &Pod) -> bool {
    pod.gpu_models.is_empty()
        && pod.min_gpu_memory_mib == 0
        && gpusched_core::state::claim_gpus(pod).is_none()
}

/// A share assignment on `gpu`.
pub fn share_on(pod: &Pod, gpu: usize, milli: u32) -> GpuAssignment {
    let memory_mib = match pod.gpu {
        GpuRequest::Share { memory_mib, .. } => memory_mib,
        _ => 0,
    };
    GpuAssignment::Share {
        gpu: gpu as u32,
        milli,
        memory_mib,
    }
}

/// Best-fit share choice: the GPU with the least compute left after
/// placing, then the lowest position (as `ClusterState::default_gpu_choice`).
pub fn share_best_fit(state: &ClusterState<'_>, pod: &Pod, node: NodeId) -> Option<GpuAssignment> {
    let mut best: Option<(u32, usize, u32)> = None;
    for_each_share(state, pod, node, |g, m, free| {
        let left = free - m;
        if best.is_none_or(|(l, _, _)| left < l) {
            best = Some((left, g, m));
        }
    });
    best.map(|(_, g, m)| share_on(pod, g, m))
}

/// Worst-fit share choice: the GPU with the most compute left after
/// placing, then the lowest position.
pub fn share_worst_fit(state: &ClusterState<'_>, pod: &Pod, node: NodeId) -> Option<GpuAssignment> {
    let mut best: Option<(u32, usize, u32)> = None;
    for_each_share(state, pod, node, |g, m, free| {
        let left = free - m;
        if best.is_none_or(|(l, _, _)| left > l) {
            best = Some((left, g, m));
        }
    });
    best.map(|(_, g, m)| share_on(pod, g, m))
}

/// The topology choice of whole GPUs, cached by (topology fingerprint,
/// free mask, count). Nodes with more than 64 GPUs are not cached.
#[derive(Default)]
pub struct WholeChooser {
    cache: Mutex<FxMap<(u64, u64, u32), Vec<u32>>>,
}

impl WholeChooser {
    pub fn new() -> Self {
        Self::default()
    }

    /// `Some(set)` of `k` allowed free GPUs (ascending positions) or `None`.
    pub fn choose(
        &self,
        state: &ClusterState<'_>,
        pod: &Pod,
        node: NodeId,
        k: u32,
    ) -> Option<Vec<u32>> {
        if gpusched_core::state::claim_gpus(pod).is_some() {
            // DRA claim constraints: allowed GPUs of one group (not cached)
            return state.claim_whole_choice(pod, node, k as usize);
        }
        let st = state.get(node);
        let n = state.node(node);
        let len = st.gpu_free_milli.len();
        let mut mask = 0u64;
        let mut free = Vec::new();
        let mut count = 0u32;
        let any_gpu = unconstrained(pod);
        for g in 0..len {
            if st.gpu_free_milli[g] as u64 == GPU_MILLI
                && (any_gpu || state.gpu_allowed(pod, node, g))
            {
                count += 1;
                if len <= 64 {
                    mask |= 1 << g;
                } else {
                    free.push(g);
                }
            }
        }
        if count < k {
            return None;
        }
        if k == 0 {
            return Some(Vec::new());
        }
        if count == k && len <= 64 {
            return Some((0..len as u32).filter(|g| mask & (1 << g) != 0).collect());
        }
        if len > 64 {
            let set = gpusched_model::topology::choose(&n.topos(), &free, &[], k as usize)?;
            return Some(set.into_iter().map(|g| g as u32).collect());
        }
        let mut h = FxHasher::default();
        h.write_usize(len);
        for t in n.gpus.iter().map(|g| &g.topo) {
            h.write_u32(t.nvlink.map_or(u32::MAX, |v| v));
            h.write_u32(t.pcie_switch.map_or(u32::MAX, |v| v));
            h.write_u32(t.numa.map_or(u32::MAX, |v| v));
        }
        let key = (h.finish(), mask, k);
        if let Ok(c) = self.cache.lock()
            && let Some(v) = c.get(&key)
            && v.iter().all(|&g| mask & (1 << g) != 0)
        {
            return Some(v.clone());
        }
        let free: Vec<usize> = (0..len).filter(|g| mask & (1 << g) != 0).collect();
        let set: Vec<u32> = gpusched_model::topology::choose(&n.topos(), &free, &[], k as usize)?
            .into_iter()
            .map(|g| g as u32)
            .collect();
        if let Ok(mut c) = self.cache.lock() {
            if c.len() > 1 << 16 {
                c.clear();
            }
            c.insert(key, set.clone());
        }
        Some(set)
    }

    /// The default choice for any request: topology for whole GPUs,
    /// `share` for shares, nothing for no GPU.
    pub fn assignment(
        &self,
        state: &ClusterState<'_>,
        pod: &Pod,
        node: NodeId,
        share: impl FnOnce() -> Option<GpuAssignment>,
    ) -> Option<GpuAssignment> {
        match pod.gpu {
            GpuRequest::None | GpuRequest::Whole(0) => Some(GpuAssignment::None),
            GpuRequest::Whole(k) => self.choose(state, pod, node, k).map(GpuAssignment::Whole),
            GpuRequest::Share { .. } => share(),
        }
    }
}

/// Free GPU milli of `node` after `gpus` were taken from it.
pub fn gpu_left_after(state: &ClusterState<'_>, node: NodeId, gpus: &GpuAssignment) -> u64 {
    state.get(node).free.gpu_milli.saturating_sub(gpus.milli())
}

/// Free CPU of `node` after placing `pod`.
pub fn cpu_left_after(state: &ClusterState<'_>, pod: &Pod, node: NodeId) -> u64 {
    state
        .get(node)
        .free
        .cpu_milli
        .saturating_sub(pod.requests.cpu_milli)
}
