//! Fragmentation: GPU capacity that is free but hard to use.
//!
//! The simulator reports the FGD definition (Weng et al., ATC '23) through
//! the packing module's [`FragEngine`]: the expected free GPU milli that a
//! pod drawn from the workload's pod-class profile could not use, summed
//! over schedulable nodes. [`typical_request_fragmentation`] is a simpler
//! definition kept for comparison.

use gpusched_core::{ClusterState, NodeId};
use gpusched_model::{GPU_MILLI, GpuRequest, Pod};
use gpusched_plugins::packing::Profile;
use gpusched_plugins::packing::fgd::FragEngine;

/// The engine the simulator measures with: the profile of every pod of the
/// scenario (each pod counted once).
pub fn engine_for<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> FragEngine {
    FragEngine::new(Profile::from_pods(pods))
}

/// FGD fragmentation (milli-GPU) of the schedulable nodes of `cs`.
///
/// The engine memoises per node id: build a new one whenever the node set
/// or a node's GPUs change.
pub fn fragmentation_milli(cs: &ClusterState<'_>, engine: &FragEngine) -> u64 {
    let mut f = 0.0;
    for (i, node) in cs.nodes().iter().enumerate() {
        if !node.unschedulable {
            f += engine.node_frag(cs, i as NodeId);
        }
    }
    if f.is_finite() && f > 0.0 {
        f.round() as u64
    } else {
        0
    }
}

/// Free GPU milli that the `typical` request cannot use:
/// - free milli on GPUs that are partially used (a whole-GPU request can
///   never use them; for a share request, only the part too small for one
///   share counts), and
/// - for a whole-GPU typical request of `k` GPUs, every fully free GPU on a
///   node with fewer than `k` fully free GPUs (or too little free CPU/memory
///   for the request).
///
/// Nodes marked unschedulable and unusable GPUs are not counted.
pub fn typical_request_fragmentation(cs: &ClusterState<'_>, typical: &Pod) -> u64 {
    let mut frag = 0u64;
    for (i, node) in cs.nodes().iter().enumerate() {
        if node.unschedulable {
            continue;
        }
        let st = &cs.states()[i];
        let fits_cpu = cs.fits_non_gpu(typical, i as u32);
        let mut whole_free = 0u64;
        for (g, &free) in st.gpu_free_milli.iter().enumerate() {
            if !st.gpu_usable[g] || free == 0 {
                continue;
            }
            let free = free as u64;
            if free == GPU_MILLI {
                whole_free += 1;
                continue;
            }
            match typical.gpu {
                GpuRequest::Share { milli, .. } if milli > 0 => {
                    frag += free % milli as u64;
                }
                _ => frag += free,
            }
        }
        let k = typical.gpu.whole() as u64;
        if k > 0 && (whole_free < k || !fits_cpu) {
            frag += whole_free * GPU_MILLI;
        }
    }
    frag
}
