//! The agent's Kubernetes side (`docs/protocol.md`): the pods of its node
//! (a watch with `spec.nodeName=<node>`), refusals as pod events, and the
//! node's GPUs, topology, health and GFD labels published onto its `Node`
//! with server-side apply (field manager `gpusched-agent`).

use crate::agent::Agent;
use crate::coord::{BoxFuture, Coordinator, EventSink, NodeFacts, NodeSink, PodSource};
use crate::decisions::{ContainerAsk, PodInfo};
use futures::StreamExt;
use gpusched_model::protocol::{
    ALLOCATIONS_VERSION, ANNOTATION_DECISION, ANNOTATION_NODE_ALLOCATIONS, ANNOTATION_NODE_GPUS,
    NodeAllocations, NodeGpu, PodAllocation,
};
use gpusched_model::sharing::{ANNOTATION_NODE_SHARING, NodeSharing, SHARING_VERSION, TimeSliced};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Field manager of every apply.
pub const FIELD_MANAGER: &str = "gpusched-agent";
/// Node-level extended resource with the GPU memory shares can take.
pub const RESOURCE_GPU_MEMORY_MIB: &str = gpusched_model::labels::RESOURCE_GPU_MEMORY_MIB;

/// The agent's view of a pod.
pub fn pod_info(p: &Pod) -> PodInfo {
    let m = &p.metadata;
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    PodInfo {
        namespace: m.namespace.clone().unwrap_or_default(),
        name: m.name.clone().unwrap_or_default(),
        uid: m.uid.clone().unwrap_or_default(),
        node: p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        created: m
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        decision: m
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_DECISION).cloned()),
        terminal: matches!(phase, Some("Succeeded") | Some("Failed")),
        containers: p.spec.as_ref().map(container_asks).unwrap_or_default(),
    }
}

/// What each container asks of `nvidia.com/gpu` and `gpusched.io/gpu-milli`
/// (limits, else requests), init containers first: the kubelet's order of
/// `Allocate` calls. A quantity that is not a plain count reads as 0 (the
/// API server refuses such extended resources anyway).
pub fn container_asks(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<ContainerAsk> {
    use k8s_openapi::api::core::v1::Container;
    let ask = |c: &Container, init: bool| {
        let get = |name: &str| {
            let r = c.resources.as_ref();
            r.and_then(|r| r.limits.as_ref()?.get(name))
                .or_else(|| r.and_then(|r| r.requests.as_ref()?.get(name)))
                .and_then(|q| q.0.trim().parse::<u32>().ok())
                .unwrap_or(0)
        };
        ContainerAsk {
            init,
            sidecar: init && c.restart_policy.as_deref() == Some("Always"),
            gpus: get(gpusched_model::labels::RESOURCE_GPU),
            milli: get(crate::plan::RESOURCE_GPU_MILLI),
        }
    };
    let mut v: Vec<ContainerAsk> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ask(c, true))
        .collect();
    v.extend(spec.containers.iter().map(|c| ask(c, false)));
    v
}

/// Pods of one node from the API server.
pub struct KubePods {
    api: Api<Pod>,
    node: String,
}

impl KubePods {
    /// The pods of `node`, read through `client`.
    pub fn new(client: Client, node: &str) -> Self {
        KubePods {
            api: Api::all(client),
            node: node.to_string(),
        }
    }

    fn selector(&self) -> String {
        format!("spec.nodeName={}", self.node)
    }
}

impl PodSource for KubePods {
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodInfo>, String>> {
        Box::pin(async move {
            let l = self
                .api
                .list(&ListParams::default().fields(&self.selector()))
                .await
                .map_err(|e| format!("list pods on node {}: {e}", self.node))?;
            Ok(l.items.iter().map(pod_info).collect())
        })
    }

    fn watch(
        self: Arc<Self>,
        coord: Arc<Coordinator>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let cfg = watcher::Config::default().fields(&self.selector());
            let mut s = watcher::watcher(self.api.clone(), cfg)
                .default_backoff()
                .boxed();
            let mut init: Vec<PodInfo> = Vec::new();
            loop {
                let ev = tokio::select! {
                    ev = s.next() => ev,
                    _ = stop.changed() => return,
                };
                match ev {
                    None => return,
                    Some(Err(e)) => tracing::warn!("pod watch: {e}"),
                    Some(Ok(watcher::Event::Init)) => init.clear(),
                    Some(Ok(watcher::Event::InitApply(p))) => init.push(pod_info(&p)),
                    Some(Ok(watcher::Event::InitDone)) => {
                        coord.replace_all(std::mem::take(&mut init))
                    }
                    Some(Ok(watcher::Event::Apply(p))) => coord.observe(pod_info(&p)),
                    Some(Ok(watcher::Event::Delete(p))) => {
                        coord.forget(p.metadata.uid.as_deref().unwrap_or_default())
                    }
                }
            }
        })
    }
}

/// Pod events through events.k8s.io.
pub struct KubeEvents {
    recorder: Recorder,
}

impl KubeEvents {
    /// Events about pods of `node`, written through `client`.
    pub fn new(client: Client, node: &str) -> Self {
        KubeEvents {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "gpusched-agent".into(),
                    instance: Some(node.to_string()),
                },
            ),
        }
    }
}

impl EventSink for KubeEvents {
    fn refused(&self, pod: &PodInfo, reason: &str, message: &str) {
        let r = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()),
            ..Default::default()
        };
        let mut note = message.to_string();
        if note.len() > 1000 {
            let mut end = 997;
            while !note.is_char_boundary(end) {
                end -= 1;
            }
            note.truncate(end);
            note.push_str("...");
        }
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Allocate".into(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&ev, &r).await {
                tracing::debug!("event: {e}");
            }
        });
    }
}

/// The agent's own Node.
pub struct KubeNode {
    api: Api<Node>,
    node: String,
}

impl KubeNode {
    /// The Node `node`, written through `client`.
    pub fn new(client: Client, node: &str) -> Self {
        KubeNode {
            api: Api::all(client),
            node: node.to_string(),
        }
    }
}

impl NodeSink for KubeNode {
    fn publish(&self, f: NodeFacts) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            let meta = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node, "labels": f.labels, "annotations": f.annotations},
            });
            self.api
                .patch(&self.node, &pp, &Patch::Apply(&meta))
                .await
                .map_err(|e| format!("apply node {}: {e}", self.node))?;
            if !f.capacity.is_empty() {
                let st = json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": self.node},
                    "status": {"capacity": f.capacity},
                });
                self.api
                    .patch_status(&self.node, &pp, &Patch::Apply(&st))
                    .await
                    .map_err(|e| format!("apply node {} status: {e}", self.node))?;
            }
            Ok(())
        })
    }
}

/// What the scheduler needs from this node now: GFD labels, the GPU list
/// with topology and health, and the shares' memory capacity.
pub fn node_facts(agent: &Agent) -> NodeFacts {
    let healthy = agent.gpu_healthy();
    let gpus: Vec<NodeGpu> = agent
        .inventory
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| NodeGpu {
            index: g.index,
            uuid: g.uuid.clone(),
            model: g.model.clone(),
            memory_mib: g.memory_mib,
            nvlink: g.topo.nvlink,
            pcie_switch: g.topo.pcie_switch,
            numa: g.topo.numa,
            healthy: healthy.get(i).copied().unwrap_or(false),
        })
        .collect();
    let mut annotations = BTreeMap::new();
    annotations.insert(
        ANNOTATION_NODE_GPUS.to_string(),
        serde_json::to_string(&gpus).unwrap_or_default(),
    );
    annotations.insert(ANNOTATION_NODE_SHARING.to_string(), {
        let mut sh = sharing(&agent.plans);
        sh.mig = mig_layout(&agent.plans, &agent.inventory);
        sh.to_annotation()
    });
    if let Some(coord) = agent.coord.get() {
        annotations.insert(
            ANNOTATION_NODE_ALLOCATIONS.to_string(),
            allocations(&coord.ledger()).to_annotation(),
        );
    }
    let mut capacity = BTreeMap::new();
    if agent.plans.iter().any(|p| p.is_share()) {
        let mib: u64 = agent
            .inventory
            .gpus
            .iter()
            .zip(&healthy)
            .filter(|(g, h)| **h && !g.mig_enabled)
            .map(|(g, _)| g.memory_mib)
            .sum();
        capacity.insert(RESOURCE_GPU_MEMORY_MIB.to_string(), mib.to_string());
    }
    NodeFacts {
        labels: crate::labels::node_labels(&agent.inventory, &agent.settings),
        annotations,
        capacity,
    }
}

/// The time-sliced resources of this node, for [`ANNOTATION_NODE_SHARING`]:
/// every advertised resource of whole GPUs with more than one replica
/// (time-sliced MIG devices are not listed: the scheduler does not place
/// them).
pub fn sharing(plans: &[crate::plan::ResourcePlan]) -> NodeSharing {
    let mut time_slicing: Vec<TimeSliced> = plans
        .iter()
        .filter(|p| p.is_time_sliced_gpu())
        .map(|p| TimeSliced {
            resource: p.name.clone(),
            of: gpusched_model::labels::RESOURCE_GPU.to_string(),
            replicas: p.replicas,
        })
        .collect();
    time_slicing.sort();
    NodeSharing {
        v: SHARING_VERSION,
        time_slicing,
        mig: Vec::new(),
    }
}

/// The node's MIG layout for [`ANNOTATION_NODE_SHARING`]: per GPU in MIG
/// mode, the devices of every MIG resource decisions govern
/// ([`crate::plan::ResourcePlan::is_mig`]: not time-sliced), each with the
/// id the kubelet is offered, its profile, compute slices and resource.
/// Ordered by GPU index, then device order.
pub fn mig_layout(
    plans: &[crate::plan::ResourcePlan],
    inv: &crate::backend::Inventory,
) -> Vec<gpusched_model::sharing::MigGpu> {
    let mut by_gpu: BTreeMap<u32, Vec<gpusched_model::sharing::MigInstance>> = BTreeMap::new();
    for p in plans.iter().filter(|p| p.is_mig()) {
        for d in &p.devices {
            let Some(u) = p.units.get(d.unit) else {
                continue;
            };
            let Some(mut m) = crate::plan::mig_instance(inv, u) else {
                continue;
            };
            m.id = d.id.clone();
            m.resource = p.name.clone();
            if let Some(g) = inv.gpus.get(u.gpu) {
                by_gpu.entry(g.index).or_default().push(m);
            }
        }
    }
    by_gpu
        .into_iter()
        .map(|(index, mut instances)| {
            instances.sort_by(|a, b| a.id.cmp(&b.id));
            gpusched_model::sharing::MigGpu { index, instances }
        })
        .collect()
}

/// What the ledger says the kubelet has been given, per pod (served whole
/// GPUs, or a served share), for [`ANNOTATION_NODE_ALLOCATIONS`]. Ordered by
/// pod UID (the ledger's order), so an unchanged ledger gives the same text.
pub fn allocations(ledger: &crate::decisions::Ledger) -> NodeAllocations {
    use crate::decisions::Grant;
    let uuid = |g: usize| {
        ledger
            .gpus()
            .get(g)
            .map(|x| x.uuid.clone())
            .unwrap_or_default()
    };
    let mut pods = Vec::new();
    for (uid, e) in ledger.entries() {
        let (gpus, milli, mig) = match &e.state {
            Ok(Grant::Whole { served, .. }) if !served.is_empty() => {
                (served.iter().map(|&g| uuid(g)).collect(), None, Vec::new())
            }
            Ok(Grant::Share {
                gpu,
                served_milli,
                mig,
                ..
            }) if *served_milli > 0 => (vec![uuid(*gpu)], Some(*served_milli), mig.clone()),
            _ => continue,
        };
        pods.push(PodAllocation {
            uid: uid.clone(),
            namespace: e.pod.namespace.clone(),
            name: e.pod.name.clone(),
            gpus,
            milli,
            mig,
        });
    }
    // pods without a decision (that bypassed the scheduler, or finished by
    // their status) that the kubelet shows holding whole GPUs: the
    // scheduler counts them there, not on GPUs of its own guess
    for (p, gpus) in ledger.held_by_others() {
        pods.push(PodAllocation {
            uid: p.uid.clone(),
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            gpus: gpus.into_iter().map(uuid).collect(),
            milli: None,
            mig: Vec::new(),
        });
    }
    pods.sort_by(|a, b| a.uid.cmp(&b.uid));
    NodeAllocations {
        v: ALLOCATIONS_VERSION,
        agent: env!("CARGO_PKG_VERSION").to_string(),
        pods,
    }
}

/// How often the published facts are recomputed besides health changes
/// (allocations change with the kubelet's calls and the pod watch).
pub const REFRESH: Duration = Duration::from_secs(5);

/// Wait before writing the Node again after a failed write.
const PUBLISH_RETRY: Duration = Duration::from_secs(2);

/// Publishes the node's facts at start, after every health change
/// (debounced by `debounce`) and when the allocations changed (checked
/// after each PodResources read and every [`REFRESH`]), retrying failures
/// every `PUBLISH_RETRY` (2 s), until `stop`.
pub async fn publish_loop(
    agent: Arc<Agent>,
    sink: Arc<dyn NodeSink>,
    debounce: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut gen_rx = agent.health_gen.subscribe();
    let coord = agent.coord.get().cloned();
    let mut last: Option<NodeFacts> = None;
    loop {
        let facts = node_facts(&agent);
        if last.as_ref() != Some(&facts) {
            match sink.publish(facts.clone()).await {
                Ok(()) => {
                    tracing::info!("published node GPUs, health and labels");
                    last = Some(facts);
                }
                Err(e) => {
                    tracing::warn!("node publish failed: {e}; retrying in {PUBLISH_RETRY:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(PUBLISH_RETRY) => {}
                        _ = stop.changed() => return,
                    }
                    continue;
                }
            }
        }
        tokio::select! {
            r = gen_rx.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(REFRESH) => continue,
            _ = async {
                match &coord {
                    Some(c) => c.reconciled.notified().await,
                    None => std::future::pending().await,
                }
            } => continue,
            _ = stop.changed() => return,
        }
        tokio::time::sleep(debounce).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decisions::{Ledger, LedgerGpu};
    use gpusched_model::protocol::{DECISION_VERSION, GpuDecision, ShareDecision};

    fn pod(name: &str, idx: &[u32], share: Option<u32>) -> PodInfo {
        let d = GpuDecision {
            v: DECISION_VERSION,
            uid: format!("uid-{name}"),
            node: "n".into(),
            seq: 1,
            indices: idx.to_vec(),
            gpus: idx.iter().map(|i| format!("GPU-{i}")).collect(),
            share: share.map(|milli| ShareDecision {
                milli,
                memory_mib: 0,
                resource: None,
                replicas: None,
            }),
            mig: None,
        };
        PodInfo {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            node: "n".into(),
            created: "2026-01-01T00:00:00Z".into(),
            decision: Some(d.to_annotation()),
            terminal: false,
            containers: Vec::new(),
        }
    }

    #[test]
    fn allocations_list_only_what_was_served() {
        let gpus = (0..4)
            .map(|i| LedgerGpu {
                index: i,
                uuid: format!("GPU-{i}"),
                memory_mib: 80_000,
            })
            .collect();
        let mut l = Ledger::new("n", gpus);
        l.replace_all(vec![
            pod("a", &[0, 1], None),
            pod("b", &[2], None),
            pod("s", &[3], Some(250)),
        ]);
        // nothing handed to the kubelet yet: nothing allocated
        assert!(allocations(&l).pods.is_empty());
        let healthy = [true; 4];
        assert_eq!(
            l.allocate_whole(&[0, 1], &healthy).unwrap().decision,
            "ml/a"
        );
        l.allocate_share(250, None, Some(3), &healthy).unwrap();
        let a = allocations(&l);
        assert_eq!(a.v, ALLOCATIONS_VERSION);
        let got: Vec<(&str, Vec<&str>, Option<u32>)> = a
            .pods
            .iter()
            .map(|p| {
                (
                    p.uid.as_str(),
                    p.gpus.iter().map(String::as_str).collect(),
                    p.milli,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("uid-a", vec!["GPU-0", "GPU-1"], None),
                ("uid-s", vec!["GPU-3"], Some(250)),
            ]
        );
        // the pod finishes: its allocation goes
        let mut done = pod("a", &[0, 1], None);
        done.terminal = true;
        l.observe(done);
        assert_eq!(allocations(&l).pods.len(), 1);
    }

    #[test]
    fn sharing_lists_time_sliced_whole_gpus_only() {
        use crate::config::{MigStrategy, Replication, Settings};
        let inv = |file: &str| {
            let path = format!("{}/../../fixtures/nodes/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            crate::backend::fake::FakeBackend::from_yaml(&text, &path)
                .unwrap()
                .inventory_ref()
                .clone()
        };
        let rep = |name: &str, replicas: u32, advertised: &str| Replication {
            name: name.into(),
            replicas,
            advertised: advertised.into(),
        };
        // own name, with shares beside it
        let s = Settings {
            replication: vec![rep("nvidia.com/gpu", 4, "nvidia.com/gpu")],
            shares: true,
            ..Default::default()
        };
        let plans = crate::plan::build_plans(&inv("pcie-l40s.yaml"), &s).unwrap();
        assert_eq!(
            sharing(&plans).to_annotation(),
            r#"{"v":1,"timeSlicing":[{"resource":"nvidia.com/gpu","of":"nvidia.com/gpu","replicas":4}]}"#
        );
        // renamed
        let s = Settings {
            replication: vec![rep("nvidia.com/gpu", 8, "nvidia.com/gpu.shared")],
            ..Default::default()
        };
        let plans = crate::plan::build_plans(&inv("pcie-l40s.yaml"), &s).unwrap();
        let sh = sharing(&plans);
        assert_eq!(sh.replicas_of("nvidia.com/gpu.shared"), Some(8));
        assert_eq!(sh.time_slicing.len(), 1);
        // no time-slicing, and time-sliced MIG devices: nothing listed
        let plans = crate::plan::build_plans(&inv("pcie-l40s.yaml"), &Settings::default()).unwrap();
        assert!(sharing(&plans).time_slicing.is_empty());
        let s = Settings {
            mig_strategy: MigStrategy::Mixed,
            replication: vec![rep("nvidia.com/mig-1g.10gb", 2, "nvidia.com/mig-1g.10gb")],
            ..Default::default()
        };
        let plans = crate::plan::build_plans(&inv("mig-a100.yaml"), &s).unwrap();
        assert!(plans.iter().any(|p| p.replicas == 2));
        assert!(sharing(&plans).time_slicing.is_empty());
    }

    #[test]
    fn container_asks_follow_the_kubelets_order() {
        let spec: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(json!({
            "initContainers": [
                {"name": "init", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                {"name": "side", "restartPolicy": "Always",
                 "resources": {"requests": {"gpusched.io/gpu-milli": "300"}}}
            ],
            "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "3"}}},
                {"name": "odd", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}},
                {"name": "cpu"}
            ]
        }))
        .unwrap();
        let got = container_asks(&spec);
        let ask = |init, sidecar, gpus, milli| ContainerAsk {
            init,
            sidecar,
            gpus,
            milli,
        };
        assert_eq!(
            got,
            vec![
                ask(true, false, 2, 0),
                ask(true, true, 0, 300),
                ask(false, false, 3, 0),
                // not a count: read as 0, the decision's size then rules
                ask(false, false, 0, 0),
                ask(false, false, 0, 0),
            ]
        );
        assert_eq!(
            crate::decisions::new_devices_per_call(&got, |c| c.gpus),
            vec![2, 1]
        );
    }
}
