//! The GPU decision the scheduler records on a pod (`gpusched.io/decision`),
//! written through the Binding's annotations so it lands in the same write
//! as `spec.nodeName`. The node agent reads it in `Allocate`; the scheduler
//! reads it back to know which GPUs a bound pod holds. Format and protocol:
//! `docs/protocol.md`.

use gpusched_core::GpuAssignment;
use gpusched_model::Node;
use serde::{Deserialize, Serialize};

/// Annotation carrying the decision (JSON).
pub const ANNOTATION_DECISION: &str = "gpusched.io/decision";
/// Version of the decision format.
pub const DECISION_VERSION: u32 = 1;
/// Longest decision text accepted (a forged or corrupted annotation must not
/// cost the scheduler or the agent more than this).
pub const MAX_DECISION_BYTES: usize = 16 * 1024;

/// A GPU share of one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShareDecision {
    /// Thousandths of the GPU's compute.
    pub milli: u32,
    /// MiB of the GPU's memory (0: no memory share asked).
    #[serde(default)]
    pub memory_mib: u64,
}

/// What the scheduler decided for one pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuDecision {
    /// Format version ([`DECISION_VERSION`]).
    pub v: u32,
    /// UID of the pod the decision was made for (a decision copied onto
    /// another pod is refused).
    pub uid: String,
    /// Node the pod was bound to.
    pub node: String,
    /// Increasing per scheduler instance; orders decisions of one node.
    pub seq: u64,
    /// Indices of the GPUs on the node (`nvidia-smi` order).
    pub indices: Vec<u32>,
    /// UUIDs of the same GPUs, in the same order.
    pub gpus: Vec<String>,
    /// Set when the pod holds a share of `gpus[0]` rather than whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<ShareDecision>,
}

/// Why a recorded decision was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    /// Longer than [`MAX_DECISION_BYTES`].
    #[error("annotation {ANNOTATION_DECISION} is {0} bytes (limit {MAX_DECISION_BYTES})")]
    TooLong(usize),
    /// Not valid JSON of the decision shape.
    #[error("annotation {ANNOTATION_DECISION} is malformed: {0}")]
    Malformed(String),
    /// A version this build does not know.
    #[error(
        "annotation {ANNOTATION_DECISION}: unknown version {0} (this build reads {DECISION_VERSION})"
    )]
    Version(u32),
    /// Made for another pod or node.
    #[error("annotation {ANNOTATION_DECISION} was made for {what} {expected:?}, not {actual:?}")]
    Mismatch {
        what: &'static str,
        expected: String,
        actual: String,
    },
    /// Names GPUs the node does not have, or twice.
    #[error("annotation {ANNOTATION_DECISION}: {0}")]
    Gpus(String),
}

impl GpuDecision {
    /// The decision for a placement of the core.
    pub fn new(uid: &str, node: &Node, seq: u64, gpus: &GpuAssignment) -> Self {
        let (indices, share) = match gpus {
            GpuAssignment::None => (Vec::new(), None),
            GpuAssignment::Whole(v) => (v.clone(), None),
            GpuAssignment::Share {
                gpu,
                milli,
                memory_mib,
            } => (
                vec![*gpu],
                Some(ShareDecision {
                    milli: *milli,
                    memory_mib: *memory_mib,
                }),
            ),
        };
        let uuids = indices
            .iter()
            .map(|&i| {
                node.gpus
                    .get(i as usize)
                    .map(|g| g.uuid.clone())
                    .unwrap_or_default()
            })
            .collect();
        GpuDecision {
            v: DECISION_VERSION,
            uid: uid.to_string(),
            node: node.name.clone(),
            seq,
            indices: indices
                .iter()
                .map(|&i| node.gpus.get(i as usize).map_or(i, |g| g.index))
                .collect(),
            gpus: uuids,
            share,
        }
    }

    /// JSON text for the annotation.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation, checking size and version only.
    pub fn parse(text: &str) -> Result<Self, DecisionError> {
        if text.len() > MAX_DECISION_BYTES {
            return Err(DecisionError::TooLong(text.len()));
        }
        let d: GpuDecision =
            serde_json::from_str(text).map_err(|e| DecisionError::Malformed(e.to_string()))?;
        if d.v != DECISION_VERSION {
            return Err(DecisionError::Version(d.v));
        }
        Ok(d)
    }

    /// The assignment this decision gives on `node`, checked against the pod
    /// and node it claims to be for and the node's GPUs.
    pub fn assignment(&self, uid: &str, node: &Node) -> Result<GpuAssignment, DecisionError> {
        if self.uid != uid {
            return Err(DecisionError::Mismatch {
                what: "pod uid",
                expected: self.uid.clone(),
                actual: uid.to_string(),
            });
        }
        if self.node != node.name {
            return Err(DecisionError::Mismatch {
                what: "node",
                expected: self.node.clone(),
                actual: node.name.clone(),
            });
        }
        if self.indices.len() != self.gpus.len() {
            return Err(DecisionError::Gpus(format!(
                "{} indices but {} uuids",
                self.indices.len(),
                self.gpus.len()
            )));
        }
        let mut pos = Vec::with_capacity(self.indices.len());
        for (&idx, uuid) in self.indices.iter().zip(&self.gpus) {
            let Some(p) = node.gpus.iter().position(|g| g.index == idx) else {
                return Err(DecisionError::Gpus(format!(
                    "node {} has no GPU {idx}",
                    node.name
                )));
            };
            if !uuid.is_empty() && node.gpus[p].uuid != *uuid {
                return Err(DecisionError::Gpus(format!(
                    "GPU {idx} of node {} is {}, not {uuid}",
                    node.name, node.gpus[p].uuid
                )));
            }
            if pos.contains(&(p as u32)) {
                return Err(DecisionError::Gpus(format!("GPU {idx} named twice")));
            }
            pos.push(p as u32);
        }
        Ok(match &self.share {
            Some(s) => {
                let [gpu] = pos[..] else {
                    return Err(DecisionError::Gpus(format!(
                        "a share names exactly one GPU, not {}",
                        pos.len()
                    )));
                };
                GpuAssignment::Share {
                    gpu,
                    milli: s.milli,
                    memory_mib: s.memory_mib,
                }
            }
            None if pos.is_empty() => GpuAssignment::None,
            None => GpuAssignment::Whole(pos),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::{Gpu, GpuHealth, ResourceVec, topology::GpuTopo};

    fn node() -> Node {
        let gpus = (0..4)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i}"),
                model: "H100".into(),
                memory_mib: 81920,
                health: GpuHealth::Healthy,
                topo: GpuTopo::default(),
            })
            .collect();
        Node::new("n1", ResourceVec::new(8000, 1 << 34, 0), gpus)
    }

    #[test]
    fn round_trip_whole_and_share() {
        let n = node();
        for a in [
            GpuAssignment::Whole(vec![2, 3]),
            GpuAssignment::Share {
                gpu: 1,
                milli: 250,
                memory_mib: 4096,
            },
            GpuAssignment::None,
        ] {
            let d = GpuDecision::new("u1", &n, 7, &a);
            let back = GpuDecision::parse(&d.to_annotation()).unwrap();
            assert_eq!(back.assignment("u1", &n).unwrap(), a);
        }
    }

    #[test]
    fn refuses_other_pod_node_and_bad_gpus() {
        let n = node();
        let d = GpuDecision::new("u1", &n, 1, &GpuAssignment::Whole(vec![0]));
        assert!(matches!(
            d.assignment("u2", &n),
            Err(DecisionError::Mismatch {
                what: "pod uid",
                ..
            })
        ));
        let mut other = node();
        other.name = "n2".into();
        assert!(d.assignment("u1", &other).is_err());
        let mut bad = d.clone();
        bad.indices = vec![9];
        assert!(
            bad.assignment("u1", &n)
                .unwrap_err()
                .to_string()
                .contains("no GPU 9")
        );
        let mut twice = d.clone();
        twice.indices = vec![0, 0];
        twice.gpus = vec!["GPU-0".into(), "GPU-0".into()];
        assert!(twice.assignment("u1", &n).is_err());
        let mut wrong_uuid = d;
        wrong_uuid.gpus = vec!["GPU-3".into()];
        assert!(wrong_uuid.assignment("u1", &n).is_err());
        assert!(matches!(
            GpuDecision::parse("{not json"),
            Err(DecisionError::Malformed(_))
        ));
        assert!(matches!(
            GpuDecision::parse(&"x".repeat(MAX_DECISION_BYTES + 1)),
            Err(DecisionError::TooLong(_))
        ));
    }
}
