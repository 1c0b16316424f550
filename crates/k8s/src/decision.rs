//! The scheduler's side of the GPU decision (`docs/protocol.md`): making
//! one for a placement of the core, and reading one back as the GPUs a bound
//! pod holds. The format itself lives in `gpusched_model::protocol`, shared
//! with the node agent.

use gpusched_core::GpuAssignment;
use gpusched_model::Node;
pub use gpusched_model::protocol::{
    ANNOTATION_DECISION, DECISION_VERSION, DecisionError, GpuDecision, MAX_DECISION_BYTES,
    MigDecision, ShareDecision,
};

/// The decision for a placement of the core.
pub fn make(uid: &str, node: &Node, seq: u64, gpus: &GpuAssignment) -> GpuDecision {
    let mut mig = None;
    let (indices, share) = match gpus {
        GpuAssignment::None => (Vec::new(), None),
        GpuAssignment::Whole(v) => (v.clone(), None),
        GpuAssignment::Mig {
            gpu,
            instances,
            milli,
        } => {
            let slots: Vec<&gpusched_model::MigSlot> = node
                .gpus
                .get(*gpu as usize)
                .map(|g| {
                    instances
                        .iter()
                        .filter_map(|&i| g.mig.get(i as usize))
                        .collect()
                })
                .unwrap_or_default();
            mig = slots.first().map(|s| {
                Box::new(MigDecision {
                    resource: s.resource.clone(),
                    profile: s.profile.clone(),
                    instances: slots.iter().map(|m| m.id.clone()).collect(),
                    milli: *milli,
                })
            });
            (vec![*gpu], None)
        }
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
        mig,
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
    if let Some(m) = &d.mig {
        let [gpu] = pos[..] else {
            return Err(DecisionError::Gpus(format!(
                "MIG instances name exactly one GPU, not {}",
                pos.len()
            )));
        };
        if d.share.is_some() {
            return Err(DecisionError::Gpus(
                "a decision is a share or MIG instances, not both".into(),
            ));
        }
        let g = &node.gpus[gpu as usize];
        let mut instances = Vec::with_capacity(m.instances.len());
        let mut milli = 0u32;
        for id in &m.instances {
            let Some(i) = g.mig.iter().position(|s| &s.id == id) else {
                return Err(DecisionError::Gpus(format!(
                    "GPU {} of node {} has no MIG instance {id}",
                    g.index, node.name
                )));
            };
            let s = &g.mig[i];
            if s.resource != m.resource || s.profile != m.profile {
                return Err(DecisionError::Gpus(format!(
                    "MIG instance {id} is {} of {}, not {} of {}",
                    s.profile, s.resource, m.profile, m.resource
                )));
            }
            if instances.contains(&(i as u32)) {
                return Err(DecisionError::Gpus(format!(
                    "MIG instance {id} named twice"
                )));
            }
            instances.push(i as u32);
            milli += s.milli;
        }
        if instances.is_empty() || milli != m.milli {
            return Err(DecisionError::Gpus(format!(
                "MIG instances measure {milli} milli-GPU, the decision says {}",
                m.milli
            )));
        }
        return Ok(GpuAssignment::Mig {
            gpu,
            instances,
            milli,
        });
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
                mig: Vec::new(),
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
    fn mig_decisions_name_their_instances_and_are_checked() {
        let mut n = node();
        n.gpus[1].mig = (0..7)
            .map(|k| gpusched_model::MigSlot {
                id: format!("MIG-{k}"),
                profile: "1g.10gb".into(),
                resource: "nvidia.com/mig-1g.10gb".into(),
                milli: 142,
            })
            .collect();
        let a = GpuAssignment::Mig {
            gpu: 1,
            instances: vec![2, 5],
            milli: 284,
        };
        let d = make("u1", &n, 3, &a);
        let text = d.to_annotation();
        assert!(
            text.contains(r#""mig":{"resource":"nvidia.com/mig-1g.10gb","profile":"1g.10gb","instances":["MIG-2","MIG-5"],"milli":284}"#),
            "{text}"
        );
        assert_eq!(d.indices, vec![1]);
        assert!(d.share.is_none());
        let back = GpuDecision::parse(&text).unwrap();
        assert_eq!(assignment(&back, "u1", &n).unwrap(), a);
        let bad = |f: &dyn Fn(&mut GpuDecision), want: &str| {
            let mut b = d.clone();
            f(&mut b);
            let e = assignment(&b, "u1", &n).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        bad(
            &|b| b.mig.as_mut().unwrap().instances[1] = "MIG-9".into(),
            "no MIG instance MIG-9",
        );
        bad(
            &|b| b.mig.as_mut().unwrap().instances[1] = "MIG-2".into(),
            "named twice",
        );
        bad(&|b| b.mig.as_mut().unwrap().milli = 1000, "measure 284");
        bad(
            &|b| b.mig.as_mut().unwrap().profile = "3g.40gb".into(),
            "is 1g.10gb",
        );
        bad(
            &|b| {
                b.indices = vec![0];
                b.gpus = vec!["GPU-0".into()];
            },
            "GPU 0 of node n1 has no MIG instance",
        );
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
