//! The scheduler's side of the GPU decision (`docs/protocol.md`): making
//! one for a placement of the core, and reading one back as the GPUs a bound
//! pod holds. The format itself lives in `gpusched_model::protocol`, shared
//! with the node agent.

use gpusched_core::GpuAssignment;
use gpusched_model::Node;
pub use gpusched_model::protocol::{
    ANNOTATION_DECISION, DECISION_VERSION, DecisionError, GpuDecision, MAX_DECISION_BYTES,
    ShareDecision,
};

/// The decision for a placement of the core.
pub fn make(uid: &str, node: &Node, seq: u64, gpus: &GpuAssignment) -> GpuDecision {
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
                resource: None,
                replicas: None,
            }),
        ),
    };
    // a stand-in UUID (no agent published the node's GPUs) is left out:
    // it names nothing, and a decision for many GPUs stays small
    let uuids = indices
        .iter()
        .map(|&i| {
            node.gpus
                .get(i as usize)
                .filter(|g| g.uuid != crate::translate::synthetic_uuid(&node.name, g.index))
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

/// The assignment this decision gives on `node`, checked against the pod
/// and node it claims to be for and the node's GPUs.
pub fn assignment(d: &GpuDecision, uid: &str, node: &Node) -> Result<GpuAssignment, DecisionError> {
    if d.uid != uid {
        return Err(DecisionError::Mismatch {
            what: "pod uid",
            expected: d.uid.clone(),
            actual: uid.to_string(),
        });
    }
    if d.node != node.name {
        return Err(DecisionError::Mismatch {
            what: "node",
            expected: d.node.clone(),
            actual: node.name.clone(),
        });
    }
    if d.indices.len() != d.gpus.len() {
        return Err(DecisionError::Gpus(format!(
            "{} indices but {} uuids",
            d.indices.len(),
            d.gpus.len()
        )));
    }
    let mut pos = Vec::with_capacity(d.indices.len());
    for (&idx, uuid) in d.indices.iter().zip(&d.gpus) {
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
    Ok(match &d.share {
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
            let d = make("u1", &n, 7, &a);
            let back = GpuDecision::parse(&d.to_annotation()).unwrap();
            assert_eq!(assignment(&back, "u1", &n).unwrap(), a);
        }
    }

    #[test]
    fn refuses_other_pod_node_and_bad_gpus() {
        let n = node();
        let d = make("u1", &n, 1, &GpuAssignment::Whole(vec![0]));
        assert!(matches!(
            assignment(&d, "u2", &n),
            Err(DecisionError::Mismatch {
                what: "pod uid",
                ..
            })
        ));
        let mut other = node();
        other.name = "n2".into();
        assert!(assignment(&d, "u1", &other).is_err());
        let mut bad = d.clone();
        bad.indices = vec![9];
        assert!(
            assignment(&bad, "u1", &n)
                .unwrap_err()
                .to_string()
                .contains("no GPU 9")
        );
        let mut twice = d.clone();
        twice.indices = vec![0, 0];
        twice.gpus = vec!["GPU-0".into(), "GPU-0".into()];
        assert!(assignment(&twice, "u1", &n).is_err());
        let mut wrong_uuid = d;
        wrong_uuid.gpus = vec!["GPU-3".into()];
        assert!(assignment(&wrong_uuid, "u1", &n).is_err());
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
