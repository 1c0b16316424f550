//! Well-known label and resource names.

/// Whole-GPU extended resource.
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";
/// Time-sliced replicas when renamed.
pub const RESOURCE_GPU_SHARED: &str = "nvidia.com/gpu.shared";
/// Prefix of MIG resources under the mixed strategy (`nvidia.com/mig-1g.10gb`).
pub const RESOURCE_MIG_PREFIX: &str = "nvidia.com/mig-";

/// Rack a node sits in.
pub const LABEL_RACK: &str = "gpusched.io/rack";
/// Block (group of racks sharing a spine) a node sits in.
pub const LABEL_BLOCK: &str = "gpusched.io/block";
/// Multi-node NVLink domain (for example one NVL72 rack) a node belongs to.
pub const LABEL_NVLINK_DOMAIN: &str = "gpusched.io/nvlink-domain";
/// Queue a pod is submitted to.
pub const LABEL_QUEUE: &str = "gpusched.io/queue";
/// Pod group (gang) a pod belongs to.
pub const LABEL_POD_GROUP: &str = "gpusched.io/pod-group";

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
