//! Shared GPUs: one measure for time-sliced replicas, MIG instances and
//! gpusched's own shares (`docs/scheduling.md`, *One measure for GPUs*).
//!
//! Everything about GPUs is counted in milli-GPU ([`GPU_MILLI`] per GPU):
//!
//! * a whole GPU is 1000;
//! * a `gpusched.io/gpu-milli` share is its milli;
//! * a **time-sliced replica** of a GPU advertised with `N` replicas is
//!   `⌊1000 / N⌋` of that GPU ([`replica_milli`]); a pod asking `k`
//!   replicas is placed as one share of `k · ⌊1000 / N⌋` of one GPU (its
//!   `k` replicas come from one GPU, so `k ≤ N`);
//! * a **MIG instance** is its profile's compute slices over the parent
//!   GPU's compute slices, `⌊1000 · g / G⌋` ([`mig_milli`]; a `1g.10gb` of
//!   an A100 or H100 is 142, a `3g.40gb` 428). Compute slices, not memory
//!   slices: the profile is named and billed by them, and the instances of
//!   any valid partition never add up to more than the GPU.
//!
//! Floors keep every sum of shares of one GPU within 1000, so a GPU counted
//! in replicas, instances and shares at once is never counted above one.
//!
//! The node agent publishes what it shares in [`ANNOTATION_NODE_SHARING`]
//! ([`NodeSharing`]) on its Node: its time-sliced resources and its MIG
//! layout (per GPU in MIG mode: each instance's device id, profile,
//! compute slices `g` of `G`, memory and the resource serving it). The
//! scheduler reads it to know what a request for a shared resource means
//! there.

use crate::resources::GPU_MILLI;
use serde::{Deserialize, Serialize};

/// Node annotation with the node's shared resources (JSON [`NodeSharing`]),
/// published by the node agent.
pub const ANNOTATION_NODE_SHARING: &str = "gpusched.io/sharing";
/// Version of the sharing format.
pub const SHARING_VERSION: u32 = 1;
/// Longest sharing text accepted.
pub const MAX_SHARING_BYTES: usize = 64 * 1024;
/// Most replicas per GPU the measure can express (one milli each).
pub const MAX_REPLICAS: u32 = GPU_MILLI as u32;
/// Most MIG instances one GPU may list (NVIDIA's largest partition is 7).
pub const MAX_MIG_INSTANCES: usize = 64;

/// One MIG instance as a node agent publishes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// The device id the kubelet advertises for it (`MIG-…`).
    pub id: String,
    /// Profile (`1g.10gb`).
    pub profile: String,
    /// Compute slices of the instance (`g`).
    pub slices: u32,
    /// Compute slices of its GPU (`G`, 7 on A100/H100).
    pub of: u32,
    /// Memory, MiB.
    #[serde(rename = "memoryMiB", default)]
    pub memory_mib: u64,
    /// The resource serving it (`nvidia.com/gpu` under `migStrategy:
    /// single`, `nvidia.com/mig-<profile>` under `mixed`).
    pub resource: String,
}

impl MigInstance {
    /// Its measure: [`mig_milli`]`(slices, of)`.
    pub fn milli(&self) -> u32 {
        mig_milli(self.slices, self.of)
    }
}

/// One GPU in MIG mode and its instances.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigGpu {
    /// The GPU's index (as in `gpusched.io/gpus`).
    pub index: u32,
    /// Its instances, in the agent's order.
    pub instances: Vec<MigInstance>,
}

/// One time-sliced resource as a node advertises it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeSliced {
    /// The name the kubelet advertises (`nvidia.com/gpu`, or
    /// `nvidia.com/gpu.shared` when renamed).
    pub resource: String,
    /// The resource whose devices are replicated (`nvidia.com/gpu`).
    pub of: String,
    /// Replicas per device.
    pub replicas: u32,
}

/// The [`ANNOTATION_NODE_SHARING`] document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSharing {
    /// Format version ([`SHARING_VERSION`]).
    pub v: u32,
    /// Time-sliced resources, by advertised name.
    #[serde(default)]
    pub time_slicing: Vec<TimeSliced>,
    /// GPUs in MIG mode whose instances the kubelet is offered, by index
    /// (absent: none; readers that predate it ignore it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigGpu>,
}

/// Why a sharing annotation was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharingError {
    /// Longer than [`MAX_SHARING_BYTES`].
    #[error("annotation {ANNOTATION_NODE_SHARING} is {0} bytes (limit {MAX_SHARING_BYTES})")]
    TooLong(usize),
    /// Not valid JSON of the sharing shape.
    #[error("annotation {ANNOTATION_NODE_SHARING} is malformed: {0}")]
    Malformed(String),
    /// A version this build does not know.
    #[error(
        "annotation {ANNOTATION_NODE_SHARING}: unknown version {0} (this build reads {SHARING_VERSION})"
    )]
    Version(u32),
    /// A value out of range.
    #[error("annotation {ANNOTATION_NODE_SHARING}: {0}")]
    Invalid(String),
}

impl NodeSharing {
    /// JSON text for the annotation.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation, checking size, version and replica counts
    /// (1..=[`MAX_REPLICAS`]) and that no resource is listed twice.
    pub fn parse(text: &str) -> Result<Self, SharingError> {
        if text.len() > MAX_SHARING_BYTES {
            return Err(SharingError::TooLong(text.len()));
        }
        let s: NodeSharing =
            serde_json::from_str(text).map_err(|e| SharingError::Malformed(e.to_string()))?;
        if s.v != SHARING_VERSION {
            return Err(SharingError::Version(s.v));
        }
        for (i, t) in s.time_slicing.iter().enumerate() {
            if t.replicas == 0 || t.replicas > MAX_REPLICAS {
                return Err(SharingError::Invalid(format!(
                    "timeSlicing[{i}] ({}): replicas {} is not in 1..={MAX_REPLICAS}",
                    t.resource, t.replicas
                )));
            }
            if s.time_slicing[..i].iter().any(|o| o.resource == t.resource) {
                return Err(SharingError::Invalid(format!(
                    "timeSlicing[{i}]: {} is listed twice",
                    t.resource
                )));
            }
        }
        let mut ids = std::collections::BTreeSet::new();
        for (i, g) in s.mig.iter().enumerate() {
            if s.mig[..i].iter().any(|o| o.index == g.index) {
                return Err(SharingError::Invalid(format!(
                    "mig[{i}]: GPU {} is listed twice",
                    g.index
                )));
            }
            if g.instances.is_empty() || g.instances.len() > MAX_MIG_INSTANCES {
                return Err(SharingError::Invalid(format!(
                    "mig[{i}] (GPU {}): {} instances is not in 1..={MAX_MIG_INSTANCES}",
                    g.index,
                    g.instances.len()
                )));
            }
            let mut used = 0u32;
            for (j, m) in g.instances.iter().enumerate() {
                let at = format!("mig[{i}].instances[{j}] (GPU {}, {})", g.index, m.id);
                if m.id.is_empty() || m.resource.is_empty() || m.profile.is_empty() {
                    return Err(SharingError::Invalid(format!(
                        "{at}: id, profile and resource must not be empty"
                    )));
                }
                if m.slices == 0 || m.slices > m.of || m.of > 64 {
                    return Err(SharingError::Invalid(format!(
                        "{at}: {} of {} compute slices is not a MIG instance",
                        m.slices, m.of
                    )));
                }
                if m.of != g.instances[0].of {
                    return Err(SharingError::Invalid(format!(
                        "{at}: the GPU's instances disagree on its compute slices ({} and {})",
                        g.instances[0].of, m.of
                    )));
                }
                used += m.slices;
                if !ids.insert(m.id.as_str()) {
                    return Err(SharingError::Invalid(format!("{at}: id listed twice")));
                }
            }
            if used > g.instances[0].of {
                return Err(SharingError::Invalid(format!(
                    "mig[{i}] (GPU {}): instances take {used} compute slices of {}",
                    g.index, g.instances[0].of
                )));
            }
        }
        Ok(s)
    }

    /// The GPU's MIG instances, if the node lists it in MIG mode.
    pub fn mig_of(&self, index: u32) -> Option<&MigGpu> {
        self.mig.iter().find(|g| g.index == index)
    }

    /// The replicas per GPU of `resource`, if the node time-slices it.
    pub fn replicas_of(&self, resource: &str) -> Option<u32> {
        self.time_slicing
            .iter()
            .find(|t| t.resource == resource)
            .map(|t| t.replicas)
    }
}

/// Milli-GPU of one time-sliced replica of a GPU shared `replicas` ways:
/// `⌊1000 / replicas⌋` (a count of 0 is read as 1).
pub fn replica_milli(replicas: u32) -> u32 {
    GPU_MILLI as u32 / replicas.max(1)
}

/// Milli-GPU of a MIG instance of `slices` compute slices on a GPU of
/// `total` compute slices: `⌊1000 · slices / total⌋` (0 when `total` is 0
/// or `slices` is more than `total`).
pub fn mig_milli(slices: u32, total: u32) -> u32 {
    if total == 0 || slices > total {
        return 0;
    }
    (u64::from(slices) * GPU_MILLI / u64::from(total)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_and_instances_never_add_up_to_more_than_a_gpu() {
        assert_eq!(replica_milli(1), 1000);
        assert_eq!(replica_milli(4), 250);
        assert_eq!(replica_milli(3), 333);
        assert_eq!(replica_milli(0), 1000);
        for n in 1..=MAX_REPLICAS {
            assert!(
                u64::from(replica_milli(n)) * u64::from(n) <= GPU_MILLI,
                "{n}"
            );
            assert!(replica_milli(n) >= 1, "{n}");
        }
        assert_eq!(mig_milli(1, 7), 142);
        assert_eq!(mig_milli(3, 7), 428);
        assert_eq!(mig_milli(7, 7), 1000);
        assert_eq!(mig_milli(2, 4), 500);
        assert_eq!(mig_milli(1, 0), 0);
        assert_eq!(mig_milli(8, 7), 0);
        // the A100/H100 partitions: 7×1g, 3g+2g+1g+1g, 2×3g, 4g+3g
        for parts in [&[1u32; 7][..], &[3, 2, 1, 1], &[3, 3], &[4, 3]] {
            let sum: u32 = parts.iter().map(|&g| mig_milli(g, 7)).sum();
            assert!(sum <= 1000, "{parts:?}: {sum}");
        }
    }

    #[test]
    fn sharing_round_trips_and_refuses_bad_text() {
        let s = NodeSharing {
            v: SHARING_VERSION,
            time_slicing: vec![TimeSliced {
                resource: "nvidia.com/gpu.shared".into(),
                of: "nvidia.com/gpu".into(),
                replicas: 4,
            }],
            mig: Vec::new(),
        };
        let text = s.to_annotation();
        assert_eq!(
            text,
            r#"{"v":1,"timeSlicing":[{"resource":"nvidia.com/gpu.shared","of":"nvidia.com/gpu","replicas":4}]}"#
        );
        assert_eq!(NodeSharing::parse(&text).unwrap(), s);
        assert_eq!(s.replicas_of("nvidia.com/gpu.shared"), Some(4));
        assert_eq!(s.replicas_of("nvidia.com/gpu"), None);
        assert_eq!(
            NodeSharing::parse(r#"{"v":2}"#),
            Err(SharingError::Version(2))
        );
        assert!(matches!(
            NodeSharing::parse("["),
            Err(SharingError::Malformed(_))
        ));
        let e = NodeSharing::parse(
            r#"{"v":1,"timeSlicing":[{"resource":"a","of":"nvidia.com/gpu","replicas":0}]}"#,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("timeSlicing[0] (a): replicas 0"),
            "{e}"
        );
        let e = NodeSharing::parse(
            r#"{"v":1,"timeSlicing":[{"resource":"a","of":"x","replicas":2},{"resource":"a","of":"x","replicas":2}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("listed twice"), "{e}");
        let long = " ".repeat(MAX_SHARING_BYTES + 1);
        assert!(matches!(
            NodeSharing::parse(&long),
            Err(SharingError::TooLong(_))
        ));
    }

    fn inst(id: &str, profile: &str, g: u32, res: &str) -> MigInstance {
        MigInstance {
            id: id.into(),
            profile: profile.into(),
            slices: g,
            of: 7,
            memory_mib: 9856,
            resource: res.into(),
        }
    }

    #[test]
    fn mig_layout_round_trips_and_refuses_impossible_partitions() {
        let s = NodeSharing {
            v: SHARING_VERSION,
            time_slicing: Vec::new(),
            mig: vec![MigGpu {
                index: 0,
                instances: vec![
                    inst("MIG-a", "3g.40gb", 3, "nvidia.com/mig-3g.40gb"),
                    inst("MIG-b", "1g.10gb", 1, "nvidia.com/mig-1g.10gb"),
                ],
            }],
        };
        let text = s.to_annotation();
        assert!(
            text.contains(r#""mig":[{"index":0,"instances":[{"id":"MIG-a""#),
            "{text}"
        );
        assert!(text.contains(r#""memoryMiB":9856"#), "{text}");
        assert_eq!(NodeSharing::parse(&text).unwrap(), s);
        assert_eq!(s.mig_of(0).unwrap().instances[0].milli(), 428);
        assert!(s.mig_of(1).is_none());
        // a v1 reader without MIG still reads a v1 text without it
        assert!(!NodeSharing::default().to_annotation().contains("mig"));
        let bad = |f: &dyn Fn(&mut NodeSharing), want: &str| {
            let mut b = s.clone();
            f(&mut b);
            let e = NodeSharing::parse(&b.to_annotation())
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        bad(
            &|b| b.mig[0].instances.push(inst("MIG-c", "4g.40gb", 4, "r")),
            "take 8 compute slices of 7",
        );
        bad(
            &|b| b.mig[0].instances[1].id = "MIG-a".into(),
            "id listed twice",
        );
        bad(
            &|b| b.mig[0].instances[1].slices = 0,
            "0 of 7 compute slices",
        );
        bad(&|b| b.mig[0].instances[1].of = 8, "disagree");
        bad(
            &|b| b.mig[0].instances[1].resource.clear(),
            "must not be empty",
        );
        bad(&|b| b.mig.push(b.mig[0].clone()), "GPU 0 is listed twice");
        bad(&|b| b.mig[0].instances.clear(), "0 instances");
    }
}
