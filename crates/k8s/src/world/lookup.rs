//! What a pod belongs to (its group, workload and queue), the members
//! each gpusched PodGroup has bound and running (for the status writer),
//! and the GPUs a node's agent reports it served.

use super::*;

impl World {
    /// Per gpusched PodGroup (`namespace/name`): members bound (or being
    /// bound) and members running.
    pub fn group_counts(&self) -> BTreeMap<String, (u32, u32)> {
        let mut out: BTreeMap<String, (u32, u32)> =
            self.groups.keys().map(|k| (k.clone(), (0, 0))).collect();
        for v in self.pods.values() {
            let Some(g) = self.group_of(v) else { continue };
            let Some(c) = out.get_mut(&g) else { continue };
            let bound =
                matches!(v.kind, PodKind::Bound { .. }) || self.assumed.contains_key(&v.uid);
            if bound {
                c.0 += 1;
            }
            if v.running {
                c.1 += 1;
            }
        }
        out
    }

    /// The group of a pod: its label's, else the PodGroup made for its
    /// Job, else its JobSet's or LeaderWorkerSet's gang.
    pub(super) fn group_of(&self, v: &PodView) -> Option<String> {
        if v.group.is_some() {
            return v.group.clone();
        }
        if let Some(job) = &v.job {
            let k = format!("{}/{job}", v.namespace);
            if self.groups.get(&k).is_some_and(|e| e.for_job) {
                return Some(k);
            }
        }
        self.workload_group(v).map(|g| g.0)
    }

    /// The workload a pod belongs to (JobSet, LeaderWorkerSet, upstream
    /// PodGroup) and what is known of it (`None`: not seen yet, or
    /// unusable).
    pub(super) fn workload_of(
        &self,
        v: &PodView,
    ) -> Option<(workloads::Member, Option<&Workload>)> {
        let m = match self.scheduling_groups.get(&v.uid) {
            Some(m) => m.clone(),
            None => workloads::member(&v.labels)?,
        };
        let w = self
            .workloads
            .get(&(m.kind, format!("{}/{}", v.namespace, m.workload)))
            .and_then(|w| w.as_ref().ok());
        Some((m, w))
    }

    /// The workload gang of a pod: its name, its size and the workload's
    /// queue label (`None` size: the workload is not known, or cannot be
    /// used; the pod waits for its group). `None`: no gang.
    pub(super) fn workload_group(
        &self,
        v: &PodView,
    ) -> Option<(String, Option<u32>, Option<&str>)> {
        let (m, w) = self.workload_of(v)?;
        let (name, min) = workloads::group_of(&v.namespace, &m, w)?;
        Some((name, min, w.and_then(|w| w.queue.as_deref())))
    }

    /// The queue label that applies to a pod: its own, else its
    /// workload's (ganged or not).
    pub(super) fn queue_label<'a>(&'a self, v: &'a PodView) -> Option<&'a str> {
        v.queue_label.as_deref().or_else(|| {
            self.workload_of(v)
                .and_then(|(_, w)| w)
                .and_then(|w| w.queue.as_deref())
        })
    }

    /// The queue a pod is counted in while pending.
    pub(super) fn queue_name(&self, v: &PodView) -> String {
        self.queue_label(v).unwrap_or(DEFAULT_QUEUE).to_string()
    }

    /// The GPUs the node's agent reports it served to pod `uid`, as
    /// positions on `nv` (`None`: not reported, or naming GPUs the node does
    /// not have).
    pub(super) fn served(
        &self,
        node: &str,
        uid: &str,
        nv: &gpusched_model::Node,
    ) -> Option<GpuAssignment> {
        let a = self.nodes.get(node)?.allocations.get(uid)?;
        let mut pos = Vec::with_capacity(a.gpus.len());
        for u in &a.gpus {
            let p = nv.gpus.iter().position(|g| &g.uuid == u)? as u32;
            if pos.contains(&p) {
                return None;
            }
            pos.push(p);
        }
        if !a.mig.is_empty() {
            // MIG instances: the positions of the ids on their one GPU
            let [gpu] = pos[..] else {
                return None;
            };
            let slots = &nv.gpus[gpu as usize].mig;
            let mut instances = Vec::with_capacity(a.mig.len());
            for id in &a.mig {
                let i = slots.iter().position(|m| &m.id == id)? as u32;
                if instances.contains(&i) {
                    return None;
                }
                instances.push(i);
            }
            instances.sort_unstable();
            let milli = instances.iter().map(|&i| slots[i as usize].milli).sum();
            return Some(GpuAssignment::Mig {
                gpu,
                instances,
                milli,
            });
        }
        match (a.milli, pos.as_slice()) {
            (Some(milli), [gpu]) => Some(GpuAssignment::Share {
                gpu: *gpu,
                milli,
                memory_mib: 0,
            }),
            (Some(_), _) | (None, []) => None,
            (None, _) => {
                pos.sort_unstable();
                Some(GpuAssignment::Whole(pos))
            }
        }
    }

    /// A pod without a queue label is charged to its workload's queue.
    pub(super) fn inherit_queue(&self, v: &PodView, pod: &mut gpusched_model::Pod) {
        if v.queue_label.is_none()
            && let Some(q) = self.queue_label(v)
        {
            pod.queue = q.to_string();
        }
    }
}
