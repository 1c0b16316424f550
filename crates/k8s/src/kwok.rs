//! Node objects for a cluster described in the simulator's vocabulary
//! (`model::spec`): the GFD labels, capacity and the `gpusched.io/gpus`
//! annotation a node with our agent would publish, plus kwok's annotation so
//! kwok keeps the node Ready without a kubelet. Used by the e2e harness and
//! the API benchmark.

use crate::translate::{ANNOTATION_NODE_GPUS, NodeGpu};
use gpusched_model::labels::{GFD_COUNT, GFD_MEMORY, GFD_PRODUCT, RESOURCE_GPU};
use gpusched_model::{Node as MNode, TaintEffect};
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// Annotation kwok manages nodes by (`--manage-nodes-with-annotation-selector`).
pub const KWOK_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// The Node object for a model node.
pub fn node_object(n: &MNode) -> Node {
    let mut labels = n.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), n.name.clone());
    labels.insert("type".into(), "kwok".into());
    let healthy = n.gpus.iter().filter(|g| g.is_healthy()).count();
    if let Some(g) = n.gpus.first() {
        labels
            .entry(GFD_PRODUCT.into())
            .or_insert_with(|| g.model.clone());
        labels
            .entry(GFD_MEMORY.into())
            .or_insert_with(|| g.memory_mib.to_string());
        labels
            .entry(GFD_COUNT.into())
            .or_insert_with(|| n.gpus.len().to_string());
    }
    let mut res: BTreeMap<String, Quantity> = BTreeMap::new();
    res.insert(
        "cpu".into(),
        Quantity(format!("{}m", n.allocatable.cpu_milli)),
    );
    res.insert("memory".into(), Quantity(n.allocatable.memory.to_string()));
    res.insert("pods".into(), Quantity("1000".into()));
    if !n.gpus.is_empty() {
        res.insert(RESOURCE_GPU.into(), Quantity(healthy.to_string()));
    }
    for (k, v) in &n.allocatable.ext {
        res.insert(k.clone(), Quantity(v.to_string()));
    }
    let gpus: Vec<NodeGpu> = n.gpus.iter().map(NodeGpu::from_model).collect();
    let mut annotations =
        BTreeMap::from([(KWOK_ANNOTATION.0.to_string(), KWOK_ANNOTATION.1.to_string())]);
    if !gpus.is_empty() {
        annotations.insert(
            ANNOTATION_NODE_GPUS.into(),
            serde_json::to_string(&gpus).unwrap_or_default(),
        );
    }
    let taints: Vec<Taint> = n
        .taints
        .iter()
        .map(|t| Taint {
            key: t.key.clone(),
            value: (!t.value.is_empty()).then(|| t.value.clone()),
            effect: match t.effect {
                TaintEffect::NoSchedule => "NoSchedule",
                TaintEffect::PreferNoSchedule => "PreferNoSchedule",
                TaintEffect::NoExecute => "NoExecute",
            }
            .into(),
            ..Default::default()
        })
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(n.name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            unschedulable: n.unschedulable.then_some(true),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(res.clone()),
            allocatable: Some(res),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::spec::ClusterSpec;

    #[test]
    fn round_trips_through_translate() {
        let spec: ClusterSpec = serde_saphyr::from_str(
            "nodes:\n  - name: dgx\n    count: 2\n    cpu: \"64\"\n    memory: 512Gi\n    rack: r1\n    gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}\n",
        )
        .unwrap();
        let nodes: Vec<_> = spec.build().unwrap().into_iter().map(|b| b.node).collect();
        for n in &nodes {
            let mut obj = node_object(n);
            // kwok marks it Ready
            obj.status.as_mut().unwrap().conditions =
                Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]);
            let v = crate::translate::node(&obj);
            assert!(v.warnings.is_empty(), "{:?}", v.warnings);
            assert!(v.ready);
            assert_eq!(v.node.gpus, n.gpus);
            assert_eq!(v.node.allocatable.cpu_milli, n.allocatable.cpu_milli);
            assert_eq!(v.node.allocatable.gpu_milli, 8000);
            assert_eq!(
                v.node.label("nvidia.com/gpu.product"),
                Some("H100-SXM5-80GB")
            );
            assert_eq!(v.node.rack(), n.rack());
        }
    }
}
