//! Pure translation of the Pod API's pod-to-pod constraints and
//! preferences (inter-pod affinity and anti-affinity, topology spread,
//! host ports, preferred node affinity) into the core's
//! [`PodConstraints`]. Errors name the pod and the field.

use crate::translate::TranslateError;
use gpusched_model::{
    HostPort, LabelSelector, NODE_NAME_FIELD, NodeNameRequirement, NodeSelectorOp,
    NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm, PodConstraints, PreferredNodeTerm,
    Protocol, SpreadConstraint, SpreadPolicy, WeightedPodAffinityTerm, WhenUnsatisfiable,
};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use std::collections::BTreeMap;

use crate::translate::field_err as err;

/// A selector operator of Kubernetes' label and node selectors.
fn selector_op(s: &str) -> Option<NodeSelectorOp> {
    Some(match s {
        "In" => NodeSelectorOp::In,
        "NotIn" => NodeSelectorOp::NotIn,
        "Exists" => NodeSelectorOp::Exists,
        "DoesNotExist" => NodeSelectorOp::DoesNotExist,
        _ => return None,
    })
}

/// A label selector's requirements (`matchLabels` as `In` of one value).
pub fn selector(
    s: &meta::LabelSelector,
    obj: &str,
    field: &str,
) -> Result<LabelSelector, TranslateError> {
    let mut requirements: Vec<NodeSelectorRequirement> = s
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| NodeSelectorRequirement {
            key: k.clone(),
            operator: NodeSelectorOp::In,
            values: vec![v.clone()],
        })
        .collect();
    for (i, e) in s.match_expressions.iter().flatten().enumerate() {
        let Some(operator) = selector_op(&e.operator) else {
            return Err(err(
                obj,
                &format!("{field}.matchExpressions[{i}].operator"),
                format!(
                    "unknown operator {:?} (In, NotIn, Exists, DoesNotExist)",
                    e.operator
                ),
            ));
        };
        requirements.push(NodeSelectorRequirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone().unwrap_or_default(),
        });
    }
    Ok(LabelSelector { requirements })
}

/// A node selector term: `matchExpressions`, and `matchFields` as
/// Kubernetes defines it (only `metadata.name`, `In`/`NotIn` with one value;
/// anything else is refused naming the field, as kube-apiserver would).
pub fn node_term(
    t: &core::NodeSelectorTerm,
    obj: &str,
    field: &str,
) -> Result<NodeSelectorTerm, TranslateError> {
    let mut exprs = Vec::new();
    for (j, e) in t.match_expressions.iter().flatten().enumerate() {
        let operator = match e.operator.as_str() {
            "Gt" => NodeSelectorOp::Gt,
            "Lt" => NodeSelectorOp::Lt,
            other => selector_op(other).ok_or_else(|| {
                err(
                    obj,
                    &format!("{field}.matchExpressions[{j}]"),
                    format!(
                        "operator {other:?} is not supported by gpusched (In, NotIn, Exists, DoesNotExist, Gt, Lt)"
                    ),
                )
            })?,
        };
        if matches!(operator, NodeSelectorOp::Gt | NodeSelectorOp::Lt) {
            let values = e.values.as_deref().unwrap_or_default();
            if values.len() != 1 || values[0].trim().parse::<i64>().is_err() {
                return Err(err(
                    obj,
                    &format!("{field}.matchExpressions[{j}].values"),
                    format!(
                        "operator {} needs exactly one integer value, got {values:?}",
                        e.operator
                    ),
                ));
            }
        }
        exprs.push(NodeSelectorRequirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone().unwrap_or_default(),
        });
    }
    let mut fields = Vec::new();
    for (j, e) in t.match_fields.iter().flatten().enumerate() {
        let at = format!("{field}.matchFields[{j}]");
        if e.key != NODE_NAME_FIELD {
            return Err(err(
                obj,
                &format!("{at}.key"),
                format!(
                    "field {:?} is not a node field selector key (only {NODE_NAME_FIELD:?})",
                    e.key
                ),
            ));
        }
        let is_in = match e.operator.as_str() {
            "In" => true,
            "NotIn" => false,
            other => {
                return Err(err(
                    obj,
                    &format!("{at}.operator"),
                    format!(
                        "operator {other:?} is not valid for a node field selector (In, NotIn)"
                    ),
                ));
            }
        };
        let [name] = e.values.as_deref().unwrap_or_default() else {
            return Err(err(
                obj,
                &format!("{at}.values"),
                format!(
                    "operator {} on {NODE_NAME_FIELD} needs exactly one value, got {:?}",
                    e.operator,
                    e.values.as_deref().unwrap_or_default()
                ),
            ));
        };
        fields.push(NodeNameRequirement {
            is_in,
            name: name.clone(),
        });
    }
    Ok(NodeSelectorTerm {
        match_expressions: exprs,
        match_fields: fields,
    })
}

/// Whether a namespace selector selects less than every namespace (has a
/// requirement).
pub fn narrow_namespace_selector(s: &meta::LabelSelector) -> bool {
    s.match_labels.as_ref().is_some_and(|m| !m.is_empty())
        || s.match_expressions.as_ref().is_some_and(|m| !m.is_empty())
}

fn affinity_term(
    t: &core::PodAffinityTerm,
    labels: &BTreeMap<String, String>,
    obj: &str,
    field: &str,
) -> Result<PodAffinityTerm, TranslateError> {
    if t.topology_key.is_empty() {
        return Err(err(
            obj,
            &format!("{field}.topologyKey"),
            "must not be empty",
        ));
    }
    let sel = match &t.label_selector {
        Some(s) => Some(
            selector(s, obj, &format!("{field}.labelSelector"))?.with_label_keys(
                labels,
                t.match_label_keys.as_deref().unwrap_or_default(),
                t.mismatch_label_keys.as_deref().unwrap_or_default(),
            ),
        ),
        None => None,
    };
    // `{}`: every namespace; narrower: the namespaces it selects, which
    // the world fills in from the Namespaces it watches
    let (all_namespaces, namespace_selector) = match &t.namespace_selector {
        None => (false, None),
        Some(s) if !narrow_namespace_selector(s) => (true, None),
        Some(s) => (
            false,
            Some(selector(s, obj, &format!("{field}.namespaceSelector"))?),
        ),
    };
    Ok(PodAffinityTerm {
        selector: sel,
        namespaces: t.namespaces.clone().unwrap_or_default(),
        all_namespaces,
        namespace_selector,
        selected_namespaces: Vec::new(),
        topology_key: t.topology_key.clone(),
    })
}

/// The pod's constraints (`None` when it has none).
pub fn constraints(
    p: &core::Pod,
    obj: &str,
) -> Result<Option<Box<PodConstraints>>, TranslateError> {
    let Some(spec) = p.spec.as_ref() else {
        return Ok(None);
    };
    let empty = BTreeMap::new();
    let labels = p.metadata.labels.as_ref().unwrap_or(&empty);
    let mut c = PodConstraints::default();
    if let Some(a) = spec.affinity.as_ref() {
        for (which, terms) in [
            (
                "podAffinity",
                a.pod_affinity.as_ref().map(|x| {
                    (
                        &x.required_during_scheduling_ignored_during_execution,
                        &x.preferred_during_scheduling_ignored_during_execution,
                    )
                }),
            ),
            (
                "podAntiAffinity",
                a.pod_anti_affinity.as_ref().map(|x| {
                    (
                        &x.required_during_scheduling_ignored_during_execution,
                        &x.preferred_during_scheduling_ignored_during_execution,
                    )
                }),
            ),
        ] {
            let Some((req, pref)) = terms else { continue };
            let mut required = Vec::new();
            for (i, t) in req.iter().flatten().enumerate() {
                let f = format!(
                    "spec.affinity.{which}.requiredDuringSchedulingIgnoredDuringExecution[{i}]"
                );
                required.push(affinity_term(t, labels, obj, &f)?);
            }
            let mut preferred = Vec::new();
            for (i, w) in pref.iter().flatten().enumerate() {
                let f = format!(
                    "spec.affinity.{which}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
                );
                if !(1..=100).contains(&w.weight) {
                    return Err(err(
                        obj,
                        &format!("{f}.weight"),
                        format!("{} is not in 1–100", w.weight),
                    ));
                }
                preferred.push(WeightedPodAffinityTerm {
                    weight: w.weight,
                    term: affinity_term(
                        &w.pod_affinity_term,
                        labels,
                        obj,
                        &format!("{f}.podAffinityTerm"),
                    )?,
                });
            }
            if which == "podAffinity" {
                c.required_affinity = required;
                c.preferred_affinity = preferred;
            } else {
                c.required_anti_affinity = required;
                c.preferred_anti_affinity = preferred;
            }
        }
        if let Some(na) = a.node_affinity.as_ref() {
            for (i, w) in na
                .preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
                .enumerate()
            {
                let f = format!(
                    "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
                );
                if !(1..=100).contains(&w.weight) {
                    return Err(err(
                        obj,
                        &format!("{f}.weight"),
                        format!("{} is not in 1–100", w.weight),
                    ));
                }
                c.preferred_node_affinity.push(PreferredNodeTerm {
                    weight: w.weight,
                    term: node_term(&w.preference, obj, &format!("{f}.preference"))?,
                });
            }
        }
    }
    for (i, t) in spec
        .topology_spread_constraints
        .iter()
        .flatten()
        .enumerate()
    {
        let f = format!("spec.topologySpreadConstraints[{i}]");
        if t.max_skew < 1 {
            return Err(err(
                obj,
                &format!("{f}.maxSkew"),
                format!("{} is less than 1", t.max_skew),
            ));
        }
        if t.topology_key.is_empty() {
            return Err(err(obj, &format!("{f}.topologyKey"), "must not be empty"));
        }
        let when_unsatisfiable = match t.when_unsatisfiable.as_str() {
            "DoNotSchedule" => WhenUnsatisfiable::DoNotSchedule,
            "ScheduleAnyway" => WhenUnsatisfiable::ScheduleAnyway,
            other => {
                return Err(err(
                    obj,
                    &format!("{f}.whenUnsatisfiable"),
                    format!("unknown value {other:?} (DoNotSchedule, ScheduleAnyway)"),
                ));
            }
        };
        let policy = |v: Option<&str>, default, name: &str| match v {
            None | Some("") => Ok(default),
            Some("Honor") => Ok(SpreadPolicy::Honor),
            Some("Ignore") => Ok(SpreadPolicy::Ignore),
            Some(other) => Err(err(
                obj,
                &format!("{f}.{name}"),
                format!("unknown value {other:?} (Honor, Ignore)"),
            )),
        };
        let min_domains = match t.min_domains {
            None => None,
            Some(m) if m >= 1 => Some(m as u32),
            Some(m) => {
                return Err(err(
                    obj,
                    &format!("{f}.minDomains"),
                    format!("{m} is less than 1"),
                ));
            }
        };
        let sel = match &t.label_selector {
            Some(s) => Some(
                selector(s, obj, &format!("{f}.labelSelector"))?.with_label_keys(
                    labels,
                    t.match_label_keys.as_deref().unwrap_or_default(),
                    &[],
                ),
            ),
            None => None,
        };
        c.spread.push(SpreadConstraint {
            max_skew: t.max_skew as u32,
            topology_key: t.topology_key.clone(),
            when_unsatisfiable,
            selector: sel,
            min_domains,
            node_affinity_policy: policy(
                t.node_affinity_policy.as_deref(),
                SpreadPolicy::Honor,
                "nodeAffinityPolicy",
            )?,
            node_taints_policy: policy(
                t.node_taints_policy.as_deref(),
                SpreadPolicy::Ignore,
                "nodeTaintsPolicy",
            )?,
        });
    }
    let containers = [
        ("containers", Some(&spec.containers)),
        ("initContainers", spec.init_containers.as_ref()),
    ];
    for (list, cs) in containers {
        for (i, ctr) in cs.into_iter().flatten().enumerate() {
            for (j, port) in ctr.ports.iter().flatten().enumerate() {
                let Some(h) = port.host_port.filter(|h| *h != 0) else {
                    continue;
                };
                let f = format!("spec.{list}[{i}].ports[{j}]");
                let Ok(port_no) = u16::try_from(h) else {
                    return Err(err(
                        obj,
                        &format!("{f}.hostPort"),
                        format!("{h} is not a port"),
                    ));
                };
                let protocol = match port.protocol.as_deref() {
                    None | Some("") | Some("TCP") => Protocol::Tcp,
                    Some("UDP") => Protocol::Udp,
                    Some("SCTP") => Protocol::Sctp,
                    Some(other) => {
                        return Err(err(
                            obj,
                            &format!("{f}.protocol"),
                            format!("unknown protocol {other:?} (TCP, UDP, SCTP)"),
                        ));
                    }
                };
                c.host_ports.push(HostPort {
                    protocol,
                    host_ip: port.host_ip.clone().unwrap_or_default(),
                    port: port_no,
                });
            }
        }
    }
    Ok((!c.is_empty()).then(|| Box::new(c)))
}
