//! A stand-in scheduler for the simulator until the plugin registry
//! (`gpusched_plugins::build`) exists: the core's action pipeline with no
//! filters and a first-fit packer that honours the node's schedulable flag,
//! taints, selectors and GPU models, and takes the core's default GPU
//! choice (topology-best set for whole GPUs, best fit for shares).

use gpusched_core::{ClusterState, NodeId, Packer, Placement, Scheduler, SchedulerOptions};
use gpusched_model::Pod;

/// First fit: every suitable node scores the same, so the core's tie-break
/// (lowest node id) decides.
#[derive(Debug, Default)]
pub struct FirstFit;

impl Packer for FirstFit {
    fn name(&self) -> &'static str {
        "first-fit"
    }

    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        let n = state.node(node);
        if n.unschedulable
            || !pod.tolerates_all(n)
            || !pod.node_selector.iter().all(|(k, v)| n.label(k) == Some(v))
            || !(pod.affinity.is_empty() || pod.affinity.iter().any(|t| t.matches(&n.labels)))
        {
            return None;
        }
        let gpus = state.default_gpu_choice(pod, node)?;
        Some(Placement { score: 0, gpus })
    }
}

/// Names of the policies [`builtin`] knows.
pub const BUILTIN_POLICIES: &[&str] = &["first-fit"];

/// The stand-in scheduler for `policy` (`None`: first-fit).
pub fn builtin(opts: SchedulerOptions, policy: Option<&str>) -> Result<Scheduler, String> {
    match policy.unwrap_or("first-fit") {
        "first-fit" => Ok(Scheduler::new(opts, vec![], Box::new(FirstFit))),
        other => Err(format!(
            "unknown policy {other:?} (known: {})",
            BUILTIN_POLICIES.join(", ")
        )),
    }
}

/// Parses the core's [`SchedulerOptions`] from YAML (unknown fields
/// refused), with errors naming the file, line and field.
pub fn options_from_yaml(file: &str, text: &str) -> Result<SchedulerOptions, crate::LoadError> {
    crate::load::parse_yaml(file, text)
}
