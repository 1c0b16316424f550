//! Queues, PodGroups (gpusched's and the scheduler-plugins') and
//! PodDisruptionBudgets.

use super::*;

fn resource_vec(
    obj: &str,
    field: &str,
    m: &BTreeMap<String, String>,
) -> Result<ResourceVec, TranslateError> {
    let mut r = ResourceVec::default();
    for (k, v) in m {
        let f = || format!("{field}[{k}]");
        let e = |e: gpusched_model::quantity::QuantityError| field_err(obj, &f(), e.to_string());
        match k.as_str() {
            "cpu" => r.cpu_milli = parse_cpu_milli(v).map_err(e)?,
            "memory" => r.memory = parse_bytes(v).map_err(e)?,
            RESOURCE_GPU => {
                r.gpu_milli = parse_integer(v)
                    .map_err(e)?
                    .saturating_mul(gpusched_model::GPU_MILLI)
            }
            gpusched_model::labels::RESOURCE_GPU_MILLI => {
                r.gpu_milli = parse_integer(v).map_err(e)?
            }
            k if k.contains('/') => {
                r.ext.insert(k.to_string(), parse_integer(v).map_err(e)?);
            }
            other => {
                return Err(field_err(
                    obj,
                    &f(),
                    format!(
                        "unknown resource {other:?} (cpu, memory, nvidia.com/gpu or an extended resource)"
                    ),
                ));
            }
        }
    }
    Ok(r)
}

/// A limit caps exactly the resources its map names; the others stay
/// unbounded (a limit of `{nvidia.com/gpu: 4}` leaves CPU and memory free).
fn resource_limit(
    obj: &str,
    field: &str,
    m: &BTreeMap<String, String>,
) -> Result<ResourceLimit, TranslateError> {
    let v = resource_vec(obj, field, m)?;
    let named: Vec<ResourceKind> = m
        .keys()
        .map(|k| ResourceKind::from_resource_name(k))
        .collect();
    Ok(ResourceLimit::named(&v, &named))
}

/// Queue CRD → the core's queue.
pub fn queue(q: &Queue) -> Result<MQueue, TranslateError> {
    let name = q.metadata.name.clone().unwrap_or_default();
    let obj = format!("queue {name}");
    let mut m = MQueue::new(name);
    m.parent = q.spec.parent.clone().filter(|p| !p.is_empty());
    if q.spec.weight == 0 {
        return Err(field_err(&obj, "spec.weight", "must be 1 or more"));
    }
    m.weight = q.spec.weight;
    m.guarantee = resource_vec(&obj, "spec.guaranteed", &q.spec.guaranteed)?;
    for (model, v) in &q.spec.guaranteed_gpus_by_model {
        let n = parse_integer(v).map_err(|e| {
            field_err(
                &obj,
                &format!("spec.guaranteedGpusByModel[{model}]"),
                e.to_string(),
            )
        })?;
        m.gpu_guarantee_by_model
            .insert(model.clone(), n.saturating_mul(gpusched_model::GPU_MILLI));
    }
    m.limit = match &q.spec.limit {
        Some(l) => Some(resource_limit(&obj, "spec.limit", l)?),
        None => None,
    };
    m.can_borrow = q.spec.borrow;
    m.reclaimable = q.spec.reclaimable;
    m.movable = q.spec.movable;
    m.min_runtime_ms = q.spec.min_runtime_seconds.map(|s| s.saturating_mul(1000));
    Ok(m)
}

/// PodGroup CRD → the core's group (`priority` resolved by the caller from
/// the PriorityClass named in the spec; `queue` defaults to
/// [`DEFAULT_QUEUE`] and may be replaced by the members' label).
pub fn group(g: &PodGroup, priority: i32) -> Result<MGroup, TranslateError> {
    let ns = g.metadata.namespace.clone().unwrap_or_default();
    let name = g.metadata.name.clone().unwrap_or_default();
    let obj = format!("podgroup {ns}/{name}");
    if g.spec.min_member == 0 {
        return Err(field_err(&obj, "spec.minMember", "must be 1 or more"));
    }
    Ok(MGroup {
        name: format!("{ns}/{name}"),
        queue: g
            .spec
            .queue
            .clone()
            .unwrap_or_else(|| DEFAULT_QUEUE.to_string()),
        min_member: g.spec.min_member,
        priority,
        topology: g.spec.topology.as_ref().map(|t| TopologyConstraint {
            level: match t.level {
                CrdLevel::Node => TopologyLevel::Node,
                CrdLevel::NvlinkDomain => TopologyLevel::NvlinkDomain,
                CrdLevel::Rack => TopologyLevel::Rack,
                CrdLevel::Block => TopologyLevel::Block,
            },
            required: t.mode == TopologyMode::Required,
        }),
        schedule_timeout_ms: g
            .spec
            .schedule_timeout_seconds
            .map(|s| s.saturating_mul(1000)),
    })
}

/// scheduler-plugins PodGroup → the core's group.
pub fn sp_group(g: &SpPodGroup) -> Result<MGroup, TranslateError> {
    let ns = g.metadata.namespace.clone().unwrap_or_default();
    let name = g.metadata.name.clone().unwrap_or_default();
    let obj = format!("podgroup.scheduling.x-k8s.io {ns}/{name}");
    let min = u32::try_from(g.spec.min_member)
        .ok()
        .filter(|&m| m >= 1)
        .ok_or_else(|| field_err(&obj, "spec.minMember", "must be 1 or more"))?;
    Ok(MGroup {
        name: format!("{ns}/{name}"),
        queue: DEFAULT_QUEUE.to_string(),
        min_member: min,
        priority: 0,
        topology: None,
        schedule_timeout_ms: g
            .spec
            .schedule_timeout_seconds
            .filter(|&s| s > 0)
            .map(|s| s as u64 * 1000),
    })
}

/// What the scheduler needs of a PodDisruptionBudget.
#[derive(Clone, Debug, PartialEq)]
pub struct PdbView {
    /// Namespace it covers.
    pub namespace: String,
    /// `spec.selector` (`None`: selects nothing).
    pub selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    /// `spec.minAvailable`.
    pub min_available: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    /// `spec.maxUnavailable`.
    pub max_unavailable: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    /// `status.disruptionsAllowed` when the disruption controller has
    /// observed the current spec.
    pub observed_allowed: Option<i32>,
}

/// PodDisruptionBudget → what the scheduler needs of it.
pub fn pdb(p: &k8s_openapi::api::policy::v1::PodDisruptionBudget) -> PdbView {
    let spec = p.spec.clone().unwrap_or_default();
    let generation = p.metadata.generation.unwrap_or(0);
    let observed_allowed = p.status.as_ref().and_then(|s| {
        (s.observed_generation.unwrap_or(-1) >= generation && generation > 0)
            .then_some(s.disruptions_allowed)
            .flatten()
    });
    PdbView {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        selector: spec.selector,
        min_available: spec.min_available,
        max_unavailable: spec.max_unavailable,
        observed_allowed,
    }
}

/// Whether a label selector selects `labels` (an empty selector selects
/// everything; an unknown operator selects nothing).
pub fn selects(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    if let Some(m) = &sel.match_labels
        && m.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    sel.match_expressions.iter().flatten().all(|e| {
        let v = labels.get(&e.key);
        let vals = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => v.is_some_and(|v| vals.contains(v)),
            "NotIn" => !v.is_some_and(|v| vals.contains(v)),
            "Exists" => v.is_some(),
            "DoesNotExist" => v.is_none(),
            _ => false,
        }
    })
}

impl PdbView {
    /// Disruptions allowed now: the controller's figure when it is current,
    /// else computed the way the disruption controller does from the pods
    /// it selects (`expected`) and how many of them run (`healthy`).
    pub fn allowed(&self, expected: u32, healthy: u32) -> i64 {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        if let Some(a) = self.observed_allowed {
            return i64::from(a);
        }
        let scaled = |v: &IntOrString| -> i64 {
            match v {
                IntOrString::Int(i) => i64::from(*i),
                IntOrString::String(s) => {
                    let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(100);
                    (pct * i64::from(expected) + 99) / 100
                }
            }
        };
        let desired = if let Some(m) = &self.min_available {
            scaled(m)
        } else if let Some(m) = &self.max_unavailable {
            i64::from(expected) - scaled(m)
        } else {
            return 1;
        };
        i64::from(healthy) - desired
    }
}
