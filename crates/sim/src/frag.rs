//! Fragmentation: GPU capacity that is free but hard to use.
//!
//! Kept in one function so it can be swapped for the FGD definition of the
//! packing module (`gpusched_plugins::packing`) once that exists.

use gpusched_core::ClusterState;
use gpusched_model::{GPU_MILLI, GpuRequest, Pod};

/// Free GPU milli that the `typical` request cannot use:
/// - free milli on GPUs that are partially used (a whole-GPU request can
///   never use them; for a share request, only the part too small for one
///   share counts), and
/// - for a whole-GPU typical request of `k` GPUs, every fully free GPU on a
///   node with fewer than `k` fully free GPUs (or too little free CPU/memory
///   for the request).
///
/// Nodes marked unschedulable and unusable GPUs are not counted.
pub fn fragmentation_milli(cs: &ClusterState<'_>, typical: &Pod) -> u64 {
    let mut frag = 0u64;
    for (i, node) in cs.nodes.iter().enumerate() {
        if node.unschedulable {
            continue;
        }
        let st = &cs.state[i];
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
