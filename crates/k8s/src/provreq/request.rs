//! What a request asks for: its name ([`pr_name`]) and the pod sets of a
//! gang's members ([`pod_sets`], PodTemplates of their scheduling shape).

use super::*;

/// A stable 32-bit FNV-1a hash, for names.
fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The name of request `attempt` of a gang: `gpusched-<gang>-<hash>-<n>`
/// (the gang's name made a DNS label, clipped; the hash keeps clipped or
/// folded names apart).
pub fn pr_name(gang: &str, attempt: u32) -> String {
    let base = gang.split_once('/').map_or(gang, |(_, n)| n);
    let mut slug = String::new();
    for c in base.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug: String = slug.trim_matches('-').chars().take(40).collect();
    let slug = slug.trim_end_matches('-');
    if slug.is_empty() {
        format!("gpusched-{:08x}-{attempt}", fnv(gang))
    } else {
        format!("gpusched-{slug}-{:08x}-{attempt}", fnv(gang))
    }
}

/// Labels of a pod that name that one pod (left out of templates).
const POD_LABELS: &[&str] = &[
    "controller-revision-hash",
    "pod-template-hash",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "batch.kubernetes.io/job-completion-index",
    "jobset.sigs.k8s.io/job-index",
    "leaderworkerset.sigs.k8s.io/worker-index",
];

/// What of a pod the autoscaler's scheduling simulation reads: requests,
/// node selection, tolerations, spread and priority (names, images, env
/// and per-pod labels left out, so members of one shape count together).
fn shape(p: &Pod) -> Result<PodTemplateSpec, String> {
    let name = p.metadata.name.as_deref().unwrap_or_default();
    let spec = p
        .spec
        .as_ref()
        .ok_or_else(|| format!("pod {name} has no spec"))?;
    let container =
        |c: &k8s_openapi::api::core::v1::Container| k8s_openapi::api::core::v1::Container {
            name: c.name.clone(),
            image: c.image.clone(),
            resources: c.resources.clone(),
            ports: c.ports.clone(),
            restart_policy: c.restart_policy.clone(),
            ..Default::default()
        };
    let init = spec
        .init_containers
        .as_ref()
        .map(|v| v.iter().map(container).collect());
    let labels: BTreeMap<String, String> = p
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !POD_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: (!labels.is_empty()).then_some(labels),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: spec.containers.iter().map(container).collect(),
            init_containers: init,
            node_selector: spec.node_selector.clone(),
            affinity: spec.affinity.clone(),
            tolerations: spec.tolerations.clone(),
            topology_spread_constraints: spec.topology_spread_constraints.clone(),
            priority_class_name: spec.priority_class_name.clone(),
            priority: spec.priority,
            overhead: spec.overhead.clone(),
            runtime_class_name: spec.runtime_class_name.clone(),
            ..Default::default()
        }),
    })
}

/// The pod sets of a gang: one template per distinct shape (in the order
/// first seen) and how many members have it. Errors when a member has no
/// spec or there are more than [`MAX_POD_SETS`] shapes.
pub fn pod_sets(pods: &[Pod]) -> Result<Vec<(PodTemplateSpec, i32)>, String> {
    let mut out: Vec<(PodTemplateSpec, i32)> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for p in pods {
        let t = shape(p)?;
        // the shape is the spec (labels of the first member of a shape
        // are kept, not compared)
        let key = serde_json::to_string(&t.spec).map_err(|e| e.to_string())?;
        match index.get(&key) {
            Some(&i) => out[i].1 += 1,
            None => {
                index.insert(key, out.len());
                out.push((t, 1));
            }
        }
    }
    if out.len() > MAX_POD_SETS {
        return Err(format!(
            "the gang's members have {} distinct shapes (requests, selectors, tolerations); a ProvisioningRequest holds at most {MAX_POD_SETS}",
            out.len()
        ));
    }
    Ok(out)
}
