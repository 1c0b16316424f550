//! One decision checked against its pod and this node.

use super::*;

pub(super) fn validate(
    d: &GpuDecision,
    pod: &PodInfo,
    node: &str,
    gpus: &[LedgerGpu],
) -> Result<Grant, String> {
    if d.uid != pod.uid {
        return Err(format!(
            "decision was made for pod uid {:?}, not this pod ({:?}): copied or forged",
            d.uid, pod.uid
        ));
    }
    if d.node != node {
        return Err(format!(
            "decision was made for node {:?}, not {node:?}",
            d.node
        ));
    }
    if d.indices.len() != d.gpus.len() {
        return Err(format!(
            "{} indices but {} GPU uuids",
            d.indices.len(),
            d.gpus.len()
        ));
    }
    if d.indices.is_empty() {
        return Err("decision names no GPU".into());
    }
    let mut pos = Vec::with_capacity(d.indices.len());
    for (&i, u) in d.indices.iter().zip(&d.gpus) {
        let Some(p) = gpus.iter().position(|g| g.index == i) else {
            return Err(format!("GPU index {i} does not exist on node {node}"));
        };
        if gpus[p].uuid != *u {
            return Err(format!(
                "GPU index {i} of node {node} is {}, not {u:?}",
                gpus[p].uuid
            ));
        }
        if pos.contains(&p) {
            return Err(format!("GPU index {i} named twice"));
        }
        pos.push(p);
    }
    if let Some(m) = &d.mig {
        if pos.len() != 1 || d.share.is_some() {
            return Err(format!(
                "MIG instances name one GPU and no share, not {} GPUs{}",
                pos.len(),
                if d.share.is_some() {
                    " and a share"
                } else {
                    ""
                }
            ));
        }
        if m.instances.is_empty() || m.milli == 0 || m.milli > GPU_MILLI {
            return Err(format!(
                "MIG decision of {} instances and {} milli is not 1.. instances of 1..{GPU_MILLI}",
                m.instances.len(),
                m.milli
            ));
        }
        let distinct: BTreeSet<&String> = m.instances.iter().collect();
        if distinct.len() != m.instances.len() {
            return Err("MIG decision names an instance twice".into());
        }
        return Ok(Grant::Share {
            gpu: pos[0],
            milli: m.milli,
            memory_mib: 0,
            served_milli: 0,
            // one call of its whole size, for its resource
            slots: vec![m.milli],
            resource: Some(m.resource.clone()),
            mig: m.instances.clone(),
        });
    }
    match &d.share {
        None => Ok(Grant::Whole {
            slots: slots_for(pod, pos.len() as u32, |c| c.gpus),
            gpus: pos,
            served: BTreeSet::new(),
        }),
        Some(ShareDecision {
            milli,
            memory_mib,
            resource,
            ..
        }) => {
            if pos.len() != 1 {
                return Err(format!("a share names {} GPUs, not one", pos.len()));
            }
            // replicas may fill their GPU (N of N); a milli share may not
            let most = if resource.is_some() {
                GPU_MILLI
            } else {
                GPU_MILLI - 1
            };
            if *milli == 0 || *milli > most {
                return Err(format!("share of {milli} milli is not 1..{most}"));
            }
            if *memory_mib > gpus[pos[0]].memory_mib {
                return Err(format!(
                    "share of {memory_mib} MiB exceeds GPU {}'s {} MiB",
                    gpus[pos[0]].index, gpus[pos[0]].memory_mib
                ));
            }
            Ok(Grant::Share {
                gpu: pos[0],
                milli: *milli,
                memory_mib: *memory_mib,
                served_milli: 0,
                // a replica decision expects one call of its whole size,
                // for its resource (containers' asks of it are not read)
                slots: if resource.is_some() {
                    vec![*milli]
                } else {
                    slots_for(pod, *milli, |c| c.milli)
                },
                resource: resource.clone(),
                mig: Vec::new(),
            })
        }
    }
}
