//! Test helpers: fluent builders for nodes, pods, gangs and queues, a
//! checker of the scheduler's invariants, a trivial packer, and proptest
//! strategies for random clusters and workloads.
//!
//! ```
//! use gpusched_testkit::*;
//! let n = node("dgx").gpus(8).model("H100").nvswitch().rack("r1").build();
//! assert_eq!(n.gpus.len(), 8);
//! let p = pod("train-0").queue("research").gpus(4).priority(10).build();
//! assert_eq!(p.gpu.whole(), 4);
//! ```

use gpusched_core::{
    ClusterState, CycleOutput, Decision, GpuAssignment, NodeId, Packer, Placement, PodPhase,
    PodState, Score, Snapshot,
};
use gpusched_model::spec::{GpuLayoutSpec, Interconnect, NodeGroupSpec};
use gpusched_model::*;
use std::collections::{BTreeMap, BTreeSet};

pub mod packing;
pub mod strategies;

/// Builder of a node (via the cluster-file vocabulary).
pub struct NodeBuilder {
    spec: NodeGroupSpec,
    gpus: GpuLayoutSpec,
    unhealthy: Vec<u32>,
}

/// A node named `name`: 64 CPUs, 512 GiB, no GPUs yet (H100 80 GiB on PCIe once `gpus` is set).
pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder {
        spec: NodeGroupSpec {
            name: name.into(),
            count: 1,
            cpu: "64".into(),
            memory: "512Gi".into(),
            ..Default::default()
        },
        gpus: GpuLayoutSpec {
            count: 0,
            model: "H100".into(),
            memory: "80Gi".into(),
            interconnect: Interconnect::Pcie,
            pcie_switches: 1,
            numa_nodes: 1,
            devices: vec![],
        },
        unhealthy: vec![],
    }
}

impl NodeBuilder {
    /// `n` GPUs.
    pub fn gpus(mut self, n: u32) -> Self {
        self.gpus.count = n;
        self
    }
    /// GPU model name.
    pub fn model(mut self, m: &str) -> Self {
        self.gpus.model = m.into();
        self
    }
    /// Memory per GPU, as a quantity (`80Gi`).
    pub fn gpu_memory(mut self, q: &str) -> Self {
        self.gpus.memory = q.into();
        self
    }
    /// NVSwitch node: one NVLink domain, 4 PCIe switches, 2 NUMA nodes.
    pub fn nvswitch(mut self) -> Self {
        self.gpus.interconnect = Interconnect::Nvswitch;
        self.gpus.pcie_switches = 4;
        self.gpus.numa_nodes = 2;
        self
    }
    /// PCIe node with `switches` PCIe switches.
    pub fn pcie(mut self, switches: u32) -> Self {
        self.gpus.interconnect = Interconnect::Pcie;
        self.gpus.pcie_switches = switches;
        self
    }
    /// Allocatable CPU, as a quantity.
    pub fn cpu(mut self, q: &str) -> Self {
        self.spec.cpu = q.into();
        self
    }
    /// Allocatable memory, as a quantity.
    pub fn memory(mut self, q: &str) -> Self {
        self.spec.memory = q.into();
        self
    }
    /// Rack label.
    pub fn rack(mut self, r: &str) -> Self {
        self.spec.rack = Some(r.into());
        self
    }
    /// Block label.
    pub fn block(mut self, b: &str) -> Self {
        self.spec.block = Some(b.into());
        self
    }
    /// Multi-node NVLink domain label.
    pub fn nvlink_domain(mut self, d: &str) -> Self {
        self.spec.nvlink_domain = Some(d.into());
        self
    }
    /// Any label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.spec.labels.insert(k.into(), v.into());
        self
    }
    /// A taint `k=v:e`.
    pub fn taint(mut self, k: &str, v: &str, e: TaintEffect) -> Self {
        self.spec.taints.push(Taint {
            key: k.into(),
            value: v.into(),
            effect: e,
        });
        self
    }
    /// Cordoned.
    pub fn unschedulable(mut self) -> Self {
        self.spec.unschedulable = true;
        self
    }
    /// GPU `i` marked unhealthy.
    pub fn unhealthy_gpu(mut self, i: u32) -> Self {
        self.unhealthy.push(i);
        self
    }
    /// The node (panics on an invalid spec: test input only).
    pub fn build(mut self) -> Node {
        if self.gpus.count > 0 {
            for &i in &self.unhealthy {
                self.gpus.devices.push(spec::GpuDeviceSpec {
                    index: i,
                    healthy: Some(false),
                    ..Default::default()
                });
            }
            self.spec.gpus = Some(self.gpus);
        }
        let mut n = self
            .spec
            .build_one(0, 0)
            .expect("test node spec is valid")
            .node;
        n.sync_gpu_allocatable();
        n
    }
}

/// Builder of a pod.
pub struct PodBuilder(Pod);

/// A pod `name` in queue `default` asking 1 CPU and 1 GiB, no GPU.
pub fn pod(name: &str) -> PodBuilder {
    let mut p = Pod::new(name, "default");
    p.requests = ResourceVec::new(1000, 1 << 30, 0);
    PodBuilder(p)
}

impl PodBuilder {
    /// Queue.
    pub fn queue(mut self, q: &str) -> Self {
        self.0.queue = q.into();
        self
    }
    /// `n` whole GPUs.
    pub fn gpus(mut self, n: u32) -> Self {
        self.0.gpu = GpuRequest::Whole(n);
        self
    }
    /// A share of one GPU, `milli` thousandths of its compute.
    pub fn share(mut self, milli: u32) -> Self {
        self.0.gpu = GpuRequest::Share {
            milli,
            memory_mib: 0,
        };
        self
    }
    /// CPU request, milli-cores.
    pub fn cpu_milli(mut self, m: u64) -> Self {
        self.0.requests.cpu_milli = m;
        self
    }
    /// Priority.
    pub fn priority(mut self, p: i32) -> Self {
        self.0.priority = p;
        self
    }
    /// Member of gang `g`.
    pub fn group(mut self, g: &str) -> Self {
        self.0.group = Some(g.into());
        self
    }
    /// Allowed GPU models.
    pub fn models(mut self, m: &[&str]) -> Self {
        self.0.gpu_models = m.iter().map(|s| s.to_string()).collect();
        self
    }
    /// Arrival time, ms.
    pub fn arrival(mut self, ms: u64) -> Self {
        self.0.arrival_ms = ms;
        self
    }
    /// A `nodeSelector` entry.
    pub fn selector(mut self, k: &str, v: &str) -> Self {
        self.0.node_selector.insert(k.into(), v.into());
        self
    }
    /// Tolerates every taint with key `k`.
    pub fn toleration(mut self, k: &str) -> Self {
        self.0.tolerations.push(Toleration {
            key: k.into(),
            operator: TolerationOp::Exists,
            value: String::new(),
            effect: None,
        });
        self
    }
    /// May not be preempted or reclaimed.
    pub fn not_preemptible(mut self) -> Self {
        self.0.preemptible = false;
        self
    }
    /// Covered by a PodDisruptionBudget that allows no disruption now.
    pub fn budget_exhausted(mut self) -> Self {
        self.0.disruption_budget_exhausted = true;
        self
    }
    /// `preemptionPolicy: Never`: never evicts others.
    pub fn never_evicts(mut self) -> Self {
        self.0.may_evict = false;
        self
    }
    /// Namespace.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.0.namespace = ns.into();
        self
    }
    /// A label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0.labels.insert(k.into(), v.into());
        self
    }
    /// Required anti-affinity to pods labelled `k = v` over `topology`.
    pub fn anti_affinity(mut self, k: &str, v: &str, topology: &str) -> Self {
        self.0
            .constraints_mut()
            .required_anti_affinity
            .push(PodAffinityTerm::labelled(k, v, topology));
        self
    }
    /// Required affinity to pods labelled `k = v` over `topology`.
    pub fn affinity(mut self, k: &str, v: &str, topology: &str) -> Self {
        self.0
            .constraints_mut()
            .required_affinity
            .push(PodAffinityTerm::labelled(k, v, topology));
        self
    }
    /// Preferred affinity (`weight` > 0) or anti-affinity (`weight` < 0)
    /// to pods labelled `k = v` over `topology`.
    pub fn prefer_pods(mut self, weight: i32, k: &str, v: &str, topology: &str) -> Self {
        let term = WeightedPodAffinityTerm {
            weight: weight.abs(),
            term: PodAffinityTerm::labelled(k, v, topology),
        };
        let c = self.0.constraints_mut();
        if weight > 0 {
            c.preferred_affinity.push(term);
        } else {
            c.preferred_anti_affinity.push(term);
        }
        self
    }
    /// A spread constraint over `topology` counting pods labelled `k = v`.
    pub fn spread(mut self, max_skew: u32, topology: &str, k: &str, v: &str, hard: bool) -> Self {
        self.0.constraints_mut().spread.push(SpreadConstraint {
            max_skew,
            topology_key: topology.into(),
            when_unsatisfiable: if hard {
                WhenUnsatisfiable::DoNotSchedule
            } else {
                WhenUnsatisfiable::ScheduleAnyway
            },
            selector: Some(LabelSelector::equals([(k, v)])),
            min_domains: None,
            node_affinity_policy: SpreadPolicy::Honor,
            node_taints_policy: SpreadPolicy::Ignore,
        });
        self
    }
    /// A TCP host port on every address.
    pub fn host_port(mut self, port: u16) -> Self {
        self.0.constraints_mut().host_ports.push(HostPort {
            protocol: Protocol::Tcp,
            host_ip: String::new(),
            port,
        });
        self
    }
    /// Preferred node affinity: `weight` for nodes labelled `k = v`.
    pub fn prefer_node(mut self, weight: i32, k: &str, v: &str) -> Self {
        self.0
            .constraints_mut()
            .preferred_node_affinity
            .push(PreferredNodeTerm {
                weight,
                term: NodeSelectorTerm {
                    match_expressions: vec![NodeSelectorRequirement {
                        key: k.into(),
                        operator: NodeSelectorOp::In,
                        values: vec![v.into()],
                    }],
                    ..Default::default()
                },
            });
        self
    }
    /// A copy of the pod built so far.
    pub fn clone_pod(&self) -> Pod {
        self.0.clone()
    }
    /// The pod.
    pub fn build(self) -> Pod {
        self.0
    }
}

/// Every required pod-to-pod constraint the placements of `snap` after
/// `out` break (required affinity and anti-affinity both ways,
/// `DoNotSchedule` spread, host ports), checked by brute force over the
/// pods as placed, independently of the scheduler's counts. Only the pods
/// `out` binds are checked (a running pod's constraints held when it was
/// placed). Spread is checked against kube-scheduler's rule at the moment
/// of each bind, replaying the binds in decision order.
pub fn constraint_violations(snap: &Snapshot, out: &CycleOutput) -> Vec<String> {
    let mut placed: Vec<(usize, NodeId)> = snap
        .pods
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p.phase {
            PodPhase::Running { node, .. } | PodPhase::Terminating { node, .. } => Some((i, node)),
            _ => None,
        })
        .collect();
    let mut bad = Vec::new();
    // a node without the hostname label (the simulator's) is its own domain
    let label = |n: &Node, key: &str| {
        n.labels
            .get(key)
            .cloned()
            .or_else(|| (key == gpusched_model::labels::LABEL_HOSTNAME).then(|| n.name.clone()))
    };
    let dom = |n: NodeId, key: &str| label(&snap.nodes[n as usize], key);
    for d in &out.decisions {
        let Decision::Bind { pod, node, .. } = d else {
            continue;
        };
        let p = &snap.pods[*pod as usize].pod;
        let here = |key: &str| dom(*node, key);
        let c = p.constraints();
        let others = || {
            placed
                .iter()
                .map(|&(i, n)| (&snap.pods[i].pod, n))
                .collect::<Vec<_>>()
        };
        for t in &c.required_anti_affinity {
            if let Some(v) = here(&t.topology_key) {
                for (q, n) in others() {
                    if dom(n, &t.topology_key).as_ref() == Some(&v)
                        && t.matches(&p.namespace, &q.namespace, &q.labels)
                    {
                        bad.push(format!(
                            "{} on {}: anti-affinity to {}",
                            p.name, node, q.name
                        ));
                    }
                }
            }
        }
        for (q, n) in others() {
            for t in &q.constraints().required_anti_affinity {
                if let Some(v) = dom(n, &t.topology_key)
                    && here(&t.topology_key).as_ref() == Some(&v)
                    && t.matches(&q.namespace, &p.namespace, &p.labels)
                {
                    bad.push(format!(
                        "{} on {}: {}'s anti-affinity",
                        p.name, node, q.name
                    ));
                }
            }
        }
        if !c.required_affinity.is_empty() {
            let all_ok = c.required_affinity.iter().all(|t| {
                here(&t.topology_key).is_some_and(|v| {
                    others().iter().any(|(q, n)| {
                        dom(*n, &t.topology_key).as_ref() == Some(&v)
                            && t.matches(&p.namespace, &q.namespace, &q.labels)
                    })
                })
            });
            let first = c.required_affinity.iter().all(|t| {
                here(&t.topology_key).is_some()
                    && t.matches(&p.namespace, &p.namespace, &p.labels)
                    && !others().iter().any(|(q, n)| {
                        dom(*n, &t.topology_key).is_some()
                            && t.matches(&p.namespace, &q.namespace, &q.labels)
                    })
            });
            if !all_ok && !first {
                bad.push(format!("{} on {}: affinity unmet", p.name, node));
            }
        }
        for s in c
            .spread
            .iter()
            .filter(|s| s.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule)
        {
            let Some(v) = here(&s.topology_key) else {
                bad.push(format!(
                    "{} on {}: node lacks {}",
                    p.name, node, s.topology_key
                ));
                continue;
            };
            let keys: Vec<&str> = c
                .spread
                .iter()
                .filter(|x| x.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule)
                .map(|x| x.topology_key.as_str())
                .collect();
            let mut counts: BTreeMap<String, i64> = BTreeMap::new();
            for (i, n) in snap.nodes.iter().enumerate() {
                let eligible = keys.iter().all(|k| label(n, k).is_some())
                    && (s.node_affinity_policy == SpreadPolicy::Ignore
                        || (p
                            .node_selector
                            .iter()
                            .all(|(a, b)| n.labels.get(a) == Some(b))
                            && (p.affinity.is_empty()
                                || p.affinity.iter().any(|t| t.matches(&n.name, &n.labels)))))
                    && (s.node_taints_policy == SpreadPolicy::Ignore || p.tolerates_all(n));
                if !eligible {
                    continue;
                }
                let Some(d) = label(n, &s.topology_key) else {
                    continue;
                };
                let k = placed
                    .iter()
                    .filter(|&&(q, qn)| {
                        qn as usize == i
                            && !matches!(snap.pods[q].phase, PodPhase::Terminating { .. })
                            && snap.pods[q].pod.namespace == p.namespace
                            && s.selector
                                .as_ref()
                                .is_some_and(|sel| sel.matches(&snap.pods[q].pod.labels))
                    })
                    .count() as i64;
                *counts.entry(d).or_insert(0) += k;
            }
            let min = if (counts.len() as u32) < s.min_domains.unwrap_or(1) {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            };
            let me = s
                .selector
                .as_ref()
                .is_some_and(|sel| sel.matches(&p.labels)) as i64;
            let skew = counts.get(&v).copied().unwrap_or(0) + me - min;
            if skew > s.max_skew as i64 {
                bad.push(format!(
                    "{} on {}: skew {skew} over {}",
                    p.name, node, s.topology_key
                ));
            }
        }
        for h in &c.host_ports {
            for (q, n) in others() {
                if n == *node && q.constraints().host_ports.iter().any(|x| x.conflicts(h)) {
                    bad.push(format!(
                        "{} on {}: port {} taken by {}",
                        p.name, node, h.port, q.name
                    ));
                }
            }
        }
        placed.push((*pod as usize, *node));
    }
    bad
}

/// A queue with the model's defaults.
pub fn queue(name: &str) -> Queue {
    Queue::new(name)
}

/// A gang of at least `min` members in `queue`, priority 0, no topology or timeout.
pub fn gang(name: &str, queue: &str, min: u32) -> PodGroup {
    PodGroup {
        name: name.into(),
        queue: queue.into(),
        min_member: min,
        priority: 0,
        topology: None,
        schedule_timeout_ms: None,
    }
}

/// A snapshot from parts; every pod pending.
pub fn snapshot(
    nodes: Vec<Node>,
    queues: Vec<Queue>,
    groups: Vec<PodGroup>,
    pods: Vec<Pod>,
) -> Snapshot {
    Snapshot {
        nodes,
        queues,
        groups,
        pods: pods.into_iter().map(PodState::pending).collect(),
    }
}

/// A packer for tests: best fit on free GPU milli (fullest node first),
/// default GPU choice.
#[derive(Debug, Default)]
pub struct TestBestFit;

impl Packer for TestBestFit {
    fn name(&self) -> &'static str {
        "test-best-fit"
    }
    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        let gpus = state.default_gpu_choice(pod, node)?;
        let free = state.get(node).free.gpu_milli as i64;
        Some(Placement {
            score: Score::new(-free),
            gpus,
        })
    }
}

/// Applies a cycle's binds and evictions to the snapshot, as a runner
/// would (evicted pods go back to pending; nominations are kept for one
/// cycle).
pub fn apply(snap: &mut Snapshot, out: &CycleOutput, now_ms: u64) {
    for p in &mut snap.pods {
        if let PodPhase::Pending { nominated, .. } = &mut p.phase {
            *nominated = None;
        }
    }
    for d in &out.decisions {
        match d {
            Decision::Bind { pod, node, gpus } => {
                snap.pods[*pod as usize].phase = PodPhase::Running {
                    node: *node,
                    gpus: gpus.clone(),
                    since_ms: now_ms,
                };
            }
            Decision::Evict { pod, .. } => {
                snap.pods[*pod as usize].phase = PodPhase::Pending {
                    nominated: None,
                    nominated_at_ms: None,
                };
            }
            Decision::Nominate { pod, node } => {
                snap.pods[*pod as usize].phase = PodPhase::Pending {
                    nominated: Some(*node),
                    nominated_at_ms: Some(now_ms),
                };
            }
            Decision::Group { .. } => {}
        }
    }
}

/// Applies a cycle's evictions as a runner with a grace period does: each
/// evicted pod turns `Terminating` and keeps what it holds (until the test
/// lets it go, e.g. with [`finish_terminating`]). Binds and nominations are
/// not applied.
pub fn terminate_evicted(snap: &mut Snapshot, out: &CycleOutput) {
    for d in &out.decisions {
        if let Decision::Evict { pod, .. } = d
            && let Some(p) = snap.pods.get_mut(*pod as usize)
            && let PodPhase::Running { node, gpus, .. } = p.phase.clone()
        {
            p.phase = PodPhase::Terminating { node, gpus };
        }
    }
}

/// The terminating pods leave (their grace period is over): they go back
/// to pending, holding nothing.
pub fn finish_terminating(snap: &mut Snapshot) {
    for p in &mut snap.pods {
        if matches!(p.phase, PodPhase::Terminating { .. }) {
            p.phase = PodPhase::Pending {
                nominated: None,
                nominated_at_ms: None,
            };
        }
    }
}

/// Checks the invariants every cycle output must keep; returns the
/// violations found (empty = fine):
/// - binds only of pending pods, each at most once; evictions only of
///   running pods;
/// - the snapshot after the cycle overcommits no resource and no GPU;
/// - no bind uses what a pod evicted in the same cycle holds (it holds it
///   until it is gone);
/// - every gang with a bound member has at least `minMember` members
///   running or bound;
/// - every pending pod that was not bound has an explanation.
pub fn check_invariants(snap: &Snapshot, out: &CycleOutput) -> Vec<String> {
    let mut v = Vec::new();
    let mut bound = BTreeSet::new();
    let mut evicted = BTreeSet::new();
    for d in &out.decisions {
        match d {
            Decision::Bind { pod, .. } => {
                if !snap.pods.get(*pod as usize).is_some_and(|p| p.is_pending()) {
                    v.push(format!("bind of non-pending pod {pod}"));
                }
                if !bound.insert(*pod) {
                    v.push(format!("pod {pod} bound twice"));
                }
            }
            Decision::Evict { pod, .. } => {
                if !snap
                    .pods
                    .get(*pod as usize)
                    .is_some_and(|p| matches!(p.phase, PodPhase::Running { .. }))
                {
                    v.push(format!("eviction of non-running pod {pod}"));
                }
                evicted.insert(*pod);
            }
            _ => {}
        }
    }
    let mut after = snap.clone();
    apply(&mut after, out, 0);
    let (_, errors) = ClusterState::from_snapshot(&after);
    for (i, e) in errors {
        v.push(format!("overcommit placing pod {i}: {e}"));
    }
    // A runner's last line (the Kubernetes executor's): a pod evicted in
    // this cycle still holds its GPUs until it is gone, so no bind of the
    // same cycle may use them.
    let mut held = snap.clone();
    terminate_evicted(&mut held, out);
    for d in &out.decisions {
        if let Decision::Bind { pod, node, gpus } = d
            && let Some(p) = held.pods.get_mut(*pod as usize)
        {
            p.phase = PodPhase::Running {
                node: *node,
                gpus: gpus.clone(),
                since_ms: 0,
            };
        }
    }
    let (_, errors) = ClusterState::from_snapshot(&held);
    for (i, e) in errors {
        v.push(format!(
            "bind onto capacity still held (pods evicted this cycle have not left), at pod {}: {e}",
            held.pods[i].pod.name
        ));
    }
    let mut running_by_group: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &after.pods {
        if let (Some(g), PodPhase::Running { .. }) = (&p.pod.group, &p.phase) {
            *running_by_group.entry(g).or_insert(0) += 1;
        }
    }
    for g in &snap.groups {
        let r = running_by_group.get(g.name.as_str()).copied().unwrap_or(0);
        if r > 0 && r < g.min_member {
            v.push(format!(
                "gang {} partially running: {r} of {}",
                g.name, g.min_member
            ));
        }
    }
    let explained: BTreeSet<u32> = out.explanations.iter().map(|e| e.pod).collect();
    for (i, p) in snap.pods.iter().enumerate() {
        if p.is_pending() && !bound.contains(&(i as u32)) && !explained.contains(&(i as u32)) {
            v.push(format!("pending pod {} has no explanation", p.pod.name));
        }
    }
    v
}

/// GPUs bound per pod name, for readable assertions.
pub fn binds(snap: &Snapshot, out: &CycleOutput) -> BTreeMap<String, (String, GpuAssignment)> {
    out.decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Bind { pod, node, gpus } => Some((
                snap.pods[*pod as usize].pod.name.clone(),
                (snap.nodes[*node as usize].name.clone(), gpus.clone()),
            )),
            _ => None,
        })
        .collect()
}

/// Names of evicted pods.
pub fn evictions(snap: &Snapshot, out: &CycleOutput) -> Vec<String> {
    out.decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Evict { pod, .. } => Some(snap.pods[*pod as usize].pod.name.clone()),
            _ => None,
        })
        .collect()
}

/// The explanation of a pod by name.
pub fn explanation(snap: &Snapshot, out: &CycleOutput, name: &str) -> Option<String> {
    let id = snap.pods.iter().position(|p| p.pod.name == name)? as u32;
    out.explanations
        .iter()
        .find(|e| e.pod == id)
        .map(|e| e.message())
}
