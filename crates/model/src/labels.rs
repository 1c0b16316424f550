//! Well-known label and resource names.

/// Whole-GPU extended resource.
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";
/// Time-sliced replicas when renamed.
pub const RESOURCE_GPU_SHARED: &str = "nvidia.com/gpu.shared";
/// Prefix of MIG resources under the mixed strategy (`nvidia.com/mig-1g.10gb`).
pub const RESOURCE_MIG_PREFIX: &str = "nvidia.com/mig-";
/// Extended resource for a GPU share's compute, milli-GPU (gpusched's own).
pub const RESOURCE_GPU_MILLI: &str = "gpusched.io/gpu-milli";
/// Extended resource for a GPU share's memory, MiB (gpusched's own).
pub const RESOURCE_GPU_MEMORY_MIB: &str = "gpusched.io/gpu-memory-mib";

/// Rack a node sits in.
pub const LABEL_RACK: &str = "gpusched.io/rack";
/// Block (group of racks sharing a spine) a node sits in.
pub const LABEL_BLOCK: &str = "gpusched.io/block";
/// Multi-node NVLink domain (for example one NVL72 rack) a node belongs to.
pub const LABEL_NVLINK_DOMAIN: &str = "gpusched.io/nvlink-domain";
/// The node's own name (set by every kubelet): the node domain of
/// inter-pod affinity and topology spread.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// Zone of a node (well-known Kubernetes label).
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Queue a pod is submitted to.
pub const LABEL_QUEUE: &str = "gpusched.io/queue";
/// Pod group (gang) a pod belongs to.
pub const LABEL_POD_GROUP: &str = "gpusched.io/pod-group";

/// Label or annotation `"true"` on a pod: consolidation may move it (evict
/// it so that its controller recreates it elsewhere) to make room for a
/// pending pod of equal or higher priority. `"false"` (or absent): never.
pub const LABEL_MOVABLE: &str = "gpusched.io/movable";

/// Why a `true`/`false` flag value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a flag: use \"true\" or \"false\"")]
pub struct FlagError {
    /// The refused value.
    pub value: String,
}

/// A `"true"`/`"false"` label or annotation value (surrounding spaces
/// ignored; anything else is refused, so a typo never silently opts a pod
/// in or out).
pub fn parse_flag(value: &str) -> Result<bool, FlagError> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(FlagError {
            value: value.to_string(),
        }),
    }
}

/// GPU Feature Discovery vocabulary.
pub const GFD_PRODUCT: &str = "nvidia.com/gpu.product";
/// GPU memory in MiB (GFD).
pub const GFD_MEMORY: &str = "nvidia.com/gpu.memory";
/// Number of GPUs on the node (GFD).
pub const GFD_COUNT: &str = "nvidia.com/gpu.count";
/// Replicas advertised per GPU when shared (GFD).
pub const GFD_REPLICAS: &str = "nvidia.com/gpu.replicas";
/// Sharing strategy: `none`, `time-slicing` or `mps` (GFD).
pub const GFD_SHARING_STRATEGY: &str = "nvidia.com/gpu.sharing-strategy";
/// Whether the GPUs support MIG (GFD).
pub const GFD_MIG_CAPABLE: &str = "nvidia.com/mig.capable";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_true_or_false_and_nothing_else() {
        assert_eq!(parse_flag("true"), Ok(true));
        assert_eq!(parse_flag(" false "), Ok(false));
        for bad in ["", "yes", "True", "1"] {
            let e = parse_flag(bad).unwrap_err();
            assert_eq!(e.value, bad);
            assert!(e.to_string().contains("\"true\" or \"false\""), "{e}");
        }
    }
}
