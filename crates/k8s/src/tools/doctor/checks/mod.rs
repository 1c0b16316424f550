//! The checks, pure: [`Facts`] in, [`Report`] out. [`run`] calls each in
//! turn. A new check of one node goes in `nodes.rs`, of pods (pending,
//! leaked GPUs) in `pods.rs`, of the queue and group configuration here;
//! what it reads goes into [`super::gather`].

use super::{Facts, Finding, Report, Status, Summary, gpus_text};
use crate::world::{Built, Problem};
pub use gpusched_core::report::classify::{PendingClass, classify};
use gpusched_core::{PodPhase, Scheduler, Verdict};
use gpusched_model::protocol::{
    ANNOTATION_NODE_ALLOCATIONS, ANNOTATION_NODE_GPUS, NodeAllocations, NodeGpu,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use std::collections::{BTreeMap, BTreeSet};

mod nodes;
use nodes::{agent, gpu_resources, node_state, topology};

mod pods;
use pods::{leaks, pending};

/// Label the agent's DaemonSet puts on its pods.
pub const AGENT_POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "gpusched-agent");
/// A pod deleted this long ago (beyond its grace period) and still there is
/// stuck, and keeps its GPUs counted.
pub const STUCK_TERMINATING_MS: u64 = 5 * 60 * 1000;
/// A pod that fits now but has waited this long is not being scheduled.
pub const FITS_NOW_GRACE_MS: u64 = 60 * 1000;

fn node_name(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

fn quantity(
    m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    k: &str,
) -> Option<u64> {
    m?.get(k)?.0.trim().parse::<u64>().ok()
}

fn annotation<'a>(n: &'a Node, k: &str) -> Option<&'a str> {
    n.metadata.annotations.as_ref()?.get(k).map(String::as_str)
}

fn label<'a>(n: &'a Node, k: &str) -> Option<&'a str> {
    n.metadata.labels.as_ref()?.get(k).map(String::as_str)
}

/// Whether a node has GPUs: the agent's annotation, GFD labels, or a GPU
/// resource in its capacity.
pub fn is_gpu_node(n: &Node) -> bool {
    annotation(n, ANNOTATION_NODE_GPUS).is_some()
        || label(n, "nvidia.com/gpu.count").is_some()
        || label(n, "nvidia.com/gpu.product").is_some()
        || quantity(
            n.status.as_ref().and_then(|s| s.capacity.as_ref()),
            "nvidia.com/gpu",
        )
        .is_some()
}

fn pod_phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn pod_key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

fn ts_ms(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> u64 {
    t.0.as_millisecond().max(0) as u64
}

/// Runs every check (`namespace`: only pods of it are reported).
pub fn run(facts: &Facts, scheduler: &mut Scheduler, namespace: Option<&str>) -> Report {
    let world = facts.world();
    let built = world.build();
    let mut findings = Vec::new();
    let mut summary = Summary {
        nodes: facts.nodes.len() as u32,
        ..Summary::default()
    };
    let mut nodes: Vec<&Node> = facts.nodes.iter().collect();
    nodes.sort_by_key(|n| node_name(n));
    let gpu_nodes: Vec<&Node> = nodes.iter().copied().filter(|n| is_gpu_node(n)).collect();
    summary.gpu_nodes = gpu_nodes.len() as u32;
    for n in &built.snapshot.nodes {
        summary.gpus += n.gpus.len() as u32;
        summary.unhealthy_gpus += n.gpus.iter().filter(|g| !g.is_healthy()).count() as u32;
    }
    for p in &built.snapshot.pods {
        if let Some((_, a)) = p.holding() {
            summary.allocated_milli += a.milli();
        }
    }
    if gpu_nodes.is_empty() {
        findings.push(Finding::new(
            "gpu-resources",
            Status::Fail,
            "cluster",
            "no node has GPUs (no gpusched.io/gpus annotation, GFD labels or nvidia.com/gpu capacity)",
            "deploy the gpusched agent DaemonSet on the GPU nodes (deploy/)",
        ));
    }
    for n in &gpu_nodes {
        gpu_resources(n, &mut findings);
    }
    for n in &gpu_nodes {
        agent(n, &facts.pods, &mut findings);
    }
    for n in &nodes {
        node_state(n, is_gpu_node(n), &mut findings);
    }
    pending(
        facts,
        &built,
        scheduler,
        namespace,
        &mut findings,
        &mut summary,
    );
    for n in &gpu_nodes {
        topology(n, &mut findings);
    }
    leaks(facts, &gpu_nodes, namespace, &mut findings, &mut summary);
    config(&built, namespace, &mut findings);
    // what the scheduler reads and these credentials could not
    for u in &facts.unread {
        findings.push(Finding::new(
            "config",
            Status::Warn,
            "cluster",
            format!("could not read {u}: the report leaves those objects out"),
            "run doctor with credentials that may list what the scheduler watches (its ClusterRole)",
        ));
    }
    Report::new(summary, findings)
}

fn in_ns(namespace: Option<&str>, ns: &str) -> bool {
    namespace.is_none_or(|n| n == ns)
}

fn config(built: &Built, namespace: Option<&str>, out: &mut Vec<Finding>) {
    let before = out.len();
    for p in &built.problems {
        let f = match p {
            Problem::InvalidQueue { queue, error } => Finding::new(
                "config",
                Status::Fail,
                format!("queue/{queue}"),
                error.clone(),
                "kubectl get queue -o yaml; fix the spec (its Valid condition says the same)",
            ),
            Problem::InvalidGroup { group, error } => Finding::new(
                "config",
                Status::Fail,
                format!("podgroup/{group}"),
                error.clone(),
                "fix the PodGroup's spec",
            ),
            Problem::NodeWarning { node, warning } => Finding::new(
                "config",
                Status::Warn,
                format!("node/{node}"),
                warning.clone(),
                "",
            ),
            Problem::PodKeyWarning { pod, warning } if in_ns(namespace, &pod.namespace) => {
                Finding::new(
                    "config",
                    Status::Warn,
                    format!("pod/{}/{}", pod.namespace, pod.name),
                    warning.clone(),
                    "fix the key: an unknown gpusched.io/ key is ignored",
                )
            }
            Problem::BadDecision { pod, error } if in_ns(namespace, &pod.namespace) => {
                Finding::new(
                    "config",
                    Status::Warn,
                    format!("pod/{}/{}", pod.namespace, pod.name),
                    error.clone(),
                    "its GPUs are assumed to be the lowest free ones; the agent refuses such a decision",
                )
            }
            _ => continue,
        };
        out.push(f);
    }
    if out.len() == before {
        out.push(Finding::new(
            "config",
            Status::Ok,
            "cluster",
            "queues, pod groups and node annotations are readable",
            "",
        ));
    }
}
