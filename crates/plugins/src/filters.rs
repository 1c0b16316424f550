//! Filter plugins (the [`Filter`] extension point). Each checks one static
//! property of a node; capacity is the core's job.

use gpusched_core::FilterName;
use gpusched_core::{Filter, FilterResult, SchedulingKey};
use gpusched_model::{GpuHealth, GpuRequest, Node, Pod};

/// Cordoned or draining nodes take no new pods.
#[derive(Debug, Default)]
pub struct NodeUnschedulable;

impl Filter for NodeUnschedulable {
    fn name(&self) -> &'static str {
        FilterName::NodeUnschedulable.as_str()
    }
    fn scheduling_key(&self, _pod: &Pod, _key: &mut SchedulingKey) {}
    fn filter(&self, _pod: &Pod, node: &Node) -> FilterResult {
        if node.unschedulable {
            FilterResult::Reject("node(s) were unschedulable".into())
        } else {
            FilterResult::Pass
        }
    }
}

/// `nodeSelector` and required node affinity (terms ORed, expressions
/// ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt).
#[derive(Debug, Default)]
pub struct NodeAffinity;

impl Filter for NodeAffinity {
    fn name(&self) -> &'static str {
        FilterName::NodeAffinity.as_str()
    }
    fn scheduling_key(&self, pod: &Pod, key: &mut SchedulingKey) {
        key.add(&pod.node_selector);
        key.add(&pod.affinity);
        key.add(&pod.constraints().claim_nodes);
    }
    fn filter(&self, pod: &Pod, node: &Node) -> FilterResult {
        if let Some(ok) = &pod.constraints().claim_nodes
            && ok.binary_search(&node.name).is_err()
        {
            return FilterResult::Reject("node(s) cannot allocate the pod's ResourceClaims".into());
        }
        let sel_ok = pod
            .node_selector
            .iter()
            .all(|(k, v)| node.labels.get(k) == Some(v));
        let aff_ok = pod.affinity.is_empty()
            || pod
                .affinity
                .iter()
                .any(|t| t.matches(&node.name, &node.labels));
        if sel_ok && aff_ok {
            FilterResult::Pass
        } else {
            FilterResult::Reject("node(s) didn't match Pod's node affinity/selector".into())
        }
    }
}

/// NoSchedule and NoExecute taints must be tolerated.
#[derive(Debug, Default)]
pub struct TaintToleration;

impl Filter for TaintToleration {
    fn name(&self) -> &'static str {
        FilterName::TaintToleration.as_str()
    }
    fn scheduling_key(&self, pod: &Pod, key: &mut SchedulingKey) {
        key.add(&pod.tolerations);
    }
    fn filter(&self, pod: &Pod, node: &Node) -> FilterResult {
        if pod.tolerates_all(node) {
            FilterResult::Pass
        } else {
            FilterResult::Reject("node(s) had untolerated taint(s)".into())
        }
    }
}

/// GPU model, GPU memory and GPU health: the node must have enough healthy
/// GPUs of an allowed model with at least the requested memory.
#[derive(Debug, Default)]
pub struct GpuFit;

impl Filter for GpuFit {
    fn name(&self) -> &'static str {
        FilterName::GpuFit.as_str()
    }
    fn scheduling_key(&self, pod: &Pod, key: &mut SchedulingKey) {
        key.add(&pod.gpu);
        key.add(&pod.mig);
        key.add(&pod.gpu_models);
        key.add(&pod.min_gpu_memory_mib);
        key.add(&gpusched_core::state::claim_gpus(pod));
    }
    fn filter(&self, pod: &Pod, node: &Node) -> FilterResult {
        if let Some(ask) = &pod.mig {
            return mig_fit(pod, ask, node);
        }
        let want = match pod.gpu {
            GpuRequest::None | GpuRequest::Whole(0) => return FilterResult::Pass,
            GpuRequest::Whole(k) => k as usize,
            GpuRequest::Share { .. } => 1,
        };
        if node.gpus.is_empty() {
            return FilterResult::Reject("node(s) had no GPUs".into());
        }
        if node.replicas_only && matches!(pod.gpu, GpuRequest::Whole(_)) {
            return FilterResult::Reject(
                "node(s) offered their GPUs only as time-sliced replicas".into(),
            );
        }
        if node.gpus.iter().all(|g| g.is_mig()) {
            return FilterResult::Reject(
                "node(s) had their GPUs in MIG mode (offered only as MIG instances)".into(),
            );
        }
        let model_ok: Vec<_> = node
            .gpus
            .iter()
            .filter(|g| !g.is_mig() && pod.allows_model(&g.model))
            .collect();
        if model_ok.is_empty() {
            return FilterResult::Reject("node(s) didn't have the requested GPU model".into());
        }
        let mem_ok: Vec<_> = model_ok
            .iter()
            .filter(|g| g.memory_mib >= pod.min_gpu_memory_mib)
            .collect();
        if mem_ok.is_empty() {
            return FilterResult::Reject("node(s) had GPUs with too little memory".into());
        }
        if let GpuRequest::Share { memory_mib, .. } = pod.gpu
            && !mem_ok.iter().any(|g| g.memory_mib >= memory_mib)
        {
            return FilterResult::Reject("node(s) had GPUs with too little memory".into());
        }
        let healthy = mem_ok.iter().filter(|g| g.is_healthy()).count();
        if healthy >= want
            && let Some(c) = gpusched_core::state::claim_gpus(pod)
        {
            // DRA: the healthy GPUs its claims may take together
            let ok = node.gpus.iter().enumerate().filter(|(_, g)| {
                !g.is_mig()
                    && g.is_healthy()
                    && pod.allows_model(&g.model)
                    && g.memory_mib >= pod.min_gpu_memory_mib
            });
            if c.largest_group(&node.name, ok.map(|(i, _)| i)) < want {
                return FilterResult::Reject(c.shortage(want as u32, false).into());
            }
        }
        if healthy < want {
            if mem_ok.len() >= want {
                let failed = mem_ok
                    .iter()
                    .filter(|g| g.health == GpuHealth::Unhealthy)
                    .count();
                if healthy + failed < want {
                    // enough would be there once the kubelet offers them
                    return FilterResult::Reject(
                        "node(s) had GPUs the kubelet does not offer yet (nvidia.com/gpu allocatable below the GPUs the node agent reports)".into(),
                    );
                }
                return FilterResult::Reject("node(s) had unhealthy GPUs".into());
            }
            return FilterResult::Reject("node(s) had too few GPUs of the requested kind".into());
        }
        FilterResult::Pass
    }
}

/// [`GpuFit`] for a pod asking MIG instances: a GPU of an allowed model
/// with at least `count` instances of its (resource, profile), healthy.
/// Whether they are free is the core's question (capacity).
fn mig_fit(pod: &Pod, ask: &gpusched_model::MigAsk, node: &Node) -> FilterResult {
    let holds = |g: &gpusched_model::Gpu| {
        g.mig
            .iter()
            .filter(|m| m.resource == ask.resource && m.profile == ask.profile)
            .count()
            >= ask.count as usize
    };
    let big: Vec<_> = node.gpus.iter().filter(|g| holds(g)).collect();
    if big.is_empty() {
        return FilterResult::Reject(
            format!(
                "node(s) had no GPU with {} MIG instance(s) {} ({})",
                ask.count, ask.profile, ask.resource
            )
            .into(),
        );
    }
    let allowed: Vec<_> = big
        .into_iter()
        .filter(|g| pod.allows_model(&g.model))
        .collect();
    if allowed.is_empty() {
        return FilterResult::Reject("node(s) didn't have the requested GPU model".into());
    }
    if allowed.iter().any(|g| g.is_healthy()) {
        return FilterResult::Pass;
    }
    if allowed
        .iter()
        .all(|g| g.health == GpuHealth::NotAllocatable)
    {
        return FilterResult::Reject(format!(
            "node(s) had MIG instances the kubelet does not offer yet ({} allocatable below the instances the node agent reports)",
            ask.resource
        )
        .into());
    }
    FilterResult::Reject("node(s) had unhealthy GPUs".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::spec::{ClusterSpec, GpuLayoutSpec, NodeGroupSpec};
    use gpusched_model::*;

    fn node() -> Node {
        let mut n = ClusterSpec {
            nodes: vec![NodeGroupSpec {
                name: "n".into(),
                count: 1,
                cpu: "8".into(),
                memory: "32Gi".into(),
                gpus: Some(GpuLayoutSpec {
                    count: 2,
                    model: "A100".into(),
                    memory: "40Gi".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        }
        .nodes()
        .unwrap()
        .remove(0);
        n.labels.insert("zone".into(), "a".into());
        n
    }

    fn rejects(f: &dyn Filter, p: &Pod, n: &Node) -> bool {
        matches!(f.filter(p, n), FilterResult::Reject(_))
    }

    #[test]
    fn unschedulable() {
        let mut n = node();
        let p = Pod::new("p", "q");
        assert!(!rejects(&NodeUnschedulable, &p, &n));
        n.unschedulable = true;
        assert!(rejects(&NodeUnschedulable, &p, &n));
    }

    #[test]
    fn selector_and_affinity() {
        let n = node();
        let mut p = Pod::new("p", "q");
        p.node_selector.insert("zone".into(), "a".into());
        assert!(!rejects(&NodeAffinity, &p, &n));
        p.node_selector.insert("zone".into(), "b".into());
        assert!(rejects(&NodeAffinity, &p, &n));
        p.node_selector.clear();
        let req = |op, vals: &[&str]| NodeSelectorRequirement {
            key: "zone".into(),
            operator: op,
            values: vals.iter().map(|s| s.to_string()).collect(),
        };
        p.affinity = vec![NodeSelectorTerm {
            match_expressions: vec![req(NodeSelectorOp::NotIn, &["a"])],
            ..Default::default()
        }];
        assert!(rejects(&NodeAffinity, &p, &n));
        p.affinity.push(NodeSelectorTerm {
            match_expressions: vec![req(NodeSelectorOp::Exists, &[])],
            ..Default::default()
        });
        assert!(!rejects(&NodeAffinity, &p, &n), "terms are ORed");
        p.affinity = vec![NodeSelectorTerm {
            match_expressions: vec![
                req(NodeSelectorOp::In, &["a", "b"]),
                req(NodeSelectorOp::DoesNotExist, &[]),
            ],
            ..Default::default()
        }];
        assert!(rejects(&NodeAffinity, &p, &n), "expressions are ANDed");
        // matchFields on metadata.name (a DaemonSet pod's pin)
        let pin = |is_in, name: &str| NodeSelectorTerm {
            match_fields: vec![gpusched_model::NodeNameRequirement {
                is_in,
                name: name.into(),
            }],
            ..Default::default()
        };
        p.affinity = vec![pin(true, &n.name)];
        assert!(!rejects(&NodeAffinity, &p, &n));
        p.affinity = vec![pin(true, "elsewhere")];
        assert!(rejects(&NodeAffinity, &p, &n));
        p.affinity = vec![pin(false, &n.name)];
        assert!(rejects(&NodeAffinity, &p, &n), "NotIn its name");
        p.affinity = vec![NodeSelectorTerm::default()];
        assert!(
            rejects(&NodeAffinity, &p, &n),
            "an empty term matches no node"
        );
    }

    #[test]
    fn taints() {
        let mut n = node();
        n.taints.push(Taint {
            key: "gpu".into(),
            value: "true".into(),
            effect: TaintEffect::NoSchedule,
        });
        n.taints.push(Taint {
            key: "soft".into(),
            value: String::new(),
            effect: TaintEffect::PreferNoSchedule,
        });
        let mut p = Pod::new("p", "q");
        assert!(rejects(&TaintToleration, &p, &n));
        p.tolerations.push(Toleration {
            key: "gpu".into(),
            operator: TolerationOp::Equal,
            value: "false".into(),
            effect: None,
        });
        assert!(rejects(&TaintToleration, &p, &n));
        p.tolerations[0].value = "true".into();
        assert!(!rejects(&TaintToleration, &p, &n));
        p.tolerations[0] = Toleration {
            key: String::new(),
            operator: TolerationOp::Exists,
            value: String::new(),
            effect: Some(TaintEffect::NoExecute),
        };
        assert!(rejects(&TaintToleration, &p, &n), "wrong effect");
        p.tolerations[0].effect = None;
        assert!(
            !rejects(&TaintToleration, &p, &n),
            "empty key + Exists tolerates all"
        );
    }

    #[test]
    fn gpu_model_memory_health() {
        let mut n = node();
        let mut p = Pod::new("p", "q");
        assert!(!rejects(&GpuFit, &p, &n), "cpu-only pods pass");
        p.gpu = GpuRequest::Whole(2);
        assert!(!rejects(&GpuFit, &p, &n));
        p.gpu_models = vec!["H100".into()];
        assert_eq!(
            GpuFit.filter(&p, &n),
            FilterResult::Reject("node(s) didn't have the requested GPU model".into())
        );
        p.gpu_models = vec!["H100".into(), "A100".into()];
        p.min_gpu_memory_mib = 80 * 1024;
        assert_eq!(
            GpuFit.filter(&p, &n),
            FilterResult::Reject("node(s) had GPUs with too little memory".into())
        );
        p.min_gpu_memory_mib = 0;
        n.gpus[1].health = GpuHealth::Unhealthy;
        assert_eq!(
            GpuFit.filter(&p, &n),
            FilterResult::Reject("node(s) had unhealthy GPUs".into())
        );
        // GPUs the kubelet does not offer yet are not called unhealthy
        n.gpus[1].health = GpuHealth::NotAllocatable;
        match GpuFit.filter(&p, &n) {
            FilterResult::Reject(r) => assert!(r.contains("does not offer yet"), "{r}"),
            other => panic!("{other:?}"),
        }
        n.gpus[1].health = GpuHealth::Unhealthy;
        p.gpu = GpuRequest::Whole(3);
        assert_eq!(
            GpuFit.filter(&p, &n),
            FilterResult::Reject("node(s) had too few GPUs of the requested kind".into())
        );
    }

    #[test]
    fn replicas_only_nodes_take_no_whole_gpu() {
        let mut n = node();
        n.replicas_only = true;
        let mut p = Pod::new("p", "q");
        p.gpu = GpuRequest::Whole(1);
        assert_eq!(
            GpuFit.filter(&p, &n),
            FilterResult::Reject("node(s) offered their GPUs only as time-sliced replicas".into())
        );
        p.gpu = GpuRequest::Share {
            milli: 250,
            memory_mib: 0,
        };
        assert_eq!(GpuFit.filter(&p, &n), FilterResult::Pass);
    }

    #[test]
    fn mig_pods_need_instances_of_their_profile_and_others_avoid_mig_gpus() {
        use gpusched_model::{MigAsk, MigSlot};
        let mut n = gpu_node_for_mig();
        let slot = |k: u32, p: &str| MigSlot {
            id: format!("MIG-{k}"),
            profile: p.into(),
            resource: format!("nvidia.com/mig-{p}"),
            milli: 142,
        };
        n.gpus[0].mig = (0..7).map(|k| slot(k, "1g.10gb")).collect();
        n.gpus[1].mig = vec![slot(7, "3g.40gb"), slot(8, "3g.40gb")];
        let mut p = Pod::new("ml/m", "q");
        p.mig = Some(Box::new(MigAsk {
            resource: "nvidia.com/mig-1g.10gb".into(),
            profile: "1g.10gb".into(),
            count: 1,
        }));
        p.gpu = GpuRequest::Share {
            milli: 142,
            memory_mib: 0,
        };
        assert_eq!(GpuFit.filter(&p, &n), FilterResult::Pass);
        p.mig.as_mut().unwrap().count = 8;
        assert!(
            matches!(GpuFit.filter(&p, &n), FilterResult::Reject(r) if r.contains("no GPU with 8 MIG instance(s) 1g.10gb"))
        );
        p.mig.as_mut().unwrap().count = 1;
        p.mig.as_mut().unwrap().profile = "2g.20gb".into();
        assert!(matches!(GpuFit.filter(&p, &n), FilterResult::Reject(_)));
        p.mig.as_mut().unwrap().profile = "1g.10gb".into();
        n.gpus[0].health = GpuHealth::Unhealthy;
        assert_eq!(
            GpuFit.filter(&p, &n),
            FilterResult::Reject("node(s) had unhealthy GPUs".into())
        );
        // whole GPUs: only the GPUs not in MIG mode count
        let mut w = Pod::new("ml/w", "q");
        w.gpu = GpuRequest::Whole(2);
        assert_eq!(GpuFit.filter(&w, &n), FilterResult::Pass);
        w.gpu = GpuRequest::Whole(3);
        assert!(matches!(GpuFit.filter(&w, &n), FilterResult::Reject(_)));
        for g in &mut n.gpus {
            g.mig = vec![slot(9, "7g.80gb")];
        }
        w.gpu = GpuRequest::Whole(1);
        assert!(matches!(GpuFit.filter(&w, &n), FilterResult::Reject(r) if r.contains("MIG mode")));
    }

    fn gpu_node_for_mig() -> Node {
        let gpus = (0..4)
            .map(|i| gpusched_model::Gpu {
                index: i,
                uuid: format!("GPU-{i}"),
                model: "A100-SXM4-80GB".into(),
                memory_mib: 81920,
                health: GpuHealth::Healthy,
                topo: Default::default(),
                mig: Vec::new(),
            })
            .collect();
        Node::new("n", gpusched_model::ResourceVec::default(), gpus)
    }
}
