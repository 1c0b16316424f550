//! `resource.k8s.io/v1` objects into the allocator's terms. Whatever cannot
//! be used is an error naming the object and the field.

use super::{
    AllocatedDevice, Allocation, AttrValue, CapacityInfo, Claim, Class, Constraint, Count,
    CounterSetId, CounterUse, Counters, Device, DeviceId, DeviceTaint, DeviceToleration, PodClaim,
    Request, RequestPolicy, SubRequest,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceAttribute, DeviceClass, DeviceSelector, ResourceClaim, ResourceSlice,
};
use std::collections::BTreeMap;

/// A qualified attribute or capacity name: one without a domain is in the
/// driver's.
pub fn qualify(driver: &str, name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("{driver}/{name}")
    }
}

fn attr(a: &DeviceAttribute) -> Option<AttrValue> {
    if let Some(b) = a.bool {
        return Some(AttrValue::Bool(b));
    }
    if let Some(i) = a.int {
        return Some(AttrValue::Int(i));
    }
    if let Some(s) = &a.string {
        return Some(AttrValue::Str(s.clone()));
    }
    a.version.as_ref().map(|v| AttrValue::Version(v.clone()))
}

/// A quantity in milli-units, or an error naming the field.
fn milli(
    q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    field: &str,
) -> Result<i128, String> {
    gpusched_model::Quantity::parse(&q.0)
        .map(|q| q.milli())
        .map_err(|e| format!("{field}: {e}"))
}

/// Counters of a `counters` map, in milli-units.
fn counters(
    m: &BTreeMap<String, k8s_openapi::api::resource::v1::Counter>,
    field: &str,
) -> Result<Counters, String> {
    m.iter()
        .map(|(k, c)| Ok((k.clone(), milli(&c.value, &format!("{field}[{k}]"))?)))
        .collect()
}

/// The counter sets a slice publishes (`spec.sharedCounters`), and what
/// could not be read of them (a set with an unreadable counter is left
/// out, so the devices consuming it cannot be allocated).
pub fn counter_sets(s: &ResourceSlice) -> (Vec<(CounterSetId, Counters)>, Vec<String>) {
    let name = s.metadata.name.clone().unwrap_or_default();
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for (i, cs) in s.spec.shared_counters.iter().flatten().enumerate() {
        match counters(
            &cs.counters,
            &format!("ResourceSlice {name}: spec.sharedCounters[{i}].counters"),
        ) {
            Ok(c) => out.push((
                CounterSetId {
                    driver: s.spec.driver.clone(),
                    pool: s.spec.pool.name.clone(),
                    name: cs.name.clone(),
                },
                c,
            )),
            Err(e) => warnings.push(e),
        }
    }
    (out, warnings)
}

fn policy(
    p: &k8s_openapi::api::resource::v1::CapacityRequestPolicy,
    field: &str,
) -> Result<RequestPolicy, String> {
    let default = p
        .default
        .as_ref()
        .map(|q| milli(q, &format!("{field}.default")))
        .transpose()?;
    let mut values = p
        .valid_values
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, q)| milli(q, &format!("{field}.validValues[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    values.sort_unstable();
    let range = match &p.valid_range {
        None => None,
        Some(r) => {
            let f = format!("{field}.validRange");
            Some((
                milli(&r.min, &format!("{f}.min"))?,
                r.max
                    .as_ref()
                    .map(|q| milli(q, &format!("{f}.max")))
                    .transpose()?,
                r.step
                    .as_ref()
                    .map(|q| milli(q, &format!("{f}.step")))
                    .transpose()?,
            ))
        }
    };
    Ok(RequestPolicy {
        default,
        values,
        range,
    })
}

/// Where a slice's (or, with `perDeviceNodeSelection`, a device's)
/// devices are: `(node, node selector terms)` from `nodeName`, `allNodes`
/// or `nodeSelector`; an error naming the field when none is set or the
/// selector cannot be read.
fn placement(
    node_name: &Option<String>,
    all_nodes: Option<bool>,
    selector: Option<&k8s_openapi::api::core::v1::NodeSelector>,
    slice: &str,
    at: &str,
) -> Result<
    (
        Option<String>,
        Option<Vec<gpusched_model::NodeSelectorTerm>>,
    ),
    String,
> {
    if let Some(n) = node_name.as_ref().filter(|n| !n.is_empty()) {
        return Ok((Some(n.clone()), None));
    }
    if all_nodes == Some(true) {
        return Ok((None, None));
    }
    let Some(sel) = selector else {
        return Err(format!(
            "ResourceSlice {slice}: {at} has none of nodeName, nodeSelector, allNodes; its devices are not used"
        ));
    };
    let obj = format!("ResourceSlice {slice}");
    let mut terms = Vec::new();
    for (i, t) in sel.node_selector_terms.iter().enumerate() {
        let term = crate::podapi::node_term(
            t,
            &obj,
            &format!("{at}.nodeSelector.nodeSelectorTerms[{i}]"),
        )
        .map_err(|e| format!("{e}; its devices are not used"))?;
        terms.push(term);
    }
    Ok((None, Some(terms)))
}

/// The devices of a slice. `serial` numbers each device version. Devices
/// of a slice with a `nodeSelector` (or a device's own, with
/// `perDeviceNodeSelection`) carry the selector: they are available on
/// every node it matches.
pub fn slice(s: &ResourceSlice, serial: &mut u64) -> (Vec<Device>, Vec<String>) {
    let name = s.metadata.name.clone().unwrap_or_default();
    let spec = &s.spec;
    let mut warnings = Vec::new();
    let per_device = spec.per_device_node_selection == Some(true);
    let slice_place = if per_device {
        Ok((None, None))
    } else {
        placement(
            &spec.node_name,
            spec.all_nodes,
            spec.node_selector.as_ref(),
            &name,
            "spec",
        )
    };
    let (slice_node, slice_selector) = match slice_place {
        Ok(p) => p,
        Err(e) => {
            warnings.push(e);
            return (Vec::new(), warnings);
        }
    };
    let driver = &spec.driver;
    let mut out = Vec::new();
    for d in spec.devices.iter().flatten() {
        // perDeviceNodeSelection: each device says where it is
        let (node, selector) = if per_device {
            match placement(
                &d.node_name,
                d.all_nodes,
                d.node_selector.as_ref(),
                &name,
                &format!("spec.devices[{}]", d.name),
            ) {
                Ok(p) => p,
                Err(e) => {
                    warnings.push(format!("{e}; device {} is not used", d.name));
                    continue;
                }
            }
        } else {
            (slice_node.clone(), slice_selector.clone())
        };
        let attributes: BTreeMap<String, AttrValue> = d
            .attributes
            .iter()
            .flatten()
            .filter_map(|(k, v)| Some((qualify(driver, k), attr(v)?)))
            .collect();
        let mut capacity = BTreeMap::new();
        let mut capacity_info = BTreeMap::new();
        let mut unusable = None;
        for (k, c) in d.capacity.iter().flatten() {
            let field = format!(
                "ResourceSlice {name}: spec.devices[{}].capacity[{k}]",
                d.name
            );
            match milli(&c.value, &field) {
                Ok(q) => {
                    capacity.insert(qualify(driver, k), q);
                }
                Err(e) => warnings.push(e),
            }
            let policy = match c
                .request_policy
                .as_ref()
                .map(|p| policy(p, &format!("{field}.requestPolicy")))
            {
                None => None,
                Some(Ok(p)) => Some(p),
                Some(Err(e)) => {
                    unusable.get_or_insert(e);
                    None
                }
            };
            capacity_info.insert(
                qualify(driver, k),
                CapacityInfo {
                    name: k.clone(),
                    policy,
                },
            );
        }
        let mut consumes = Vec::new();
        for (i, u) in d.consumes_counters.iter().flatten().enumerate() {
            match counters(
                &u.counters,
                &format!(
                    "ResourceSlice {name}: spec.devices[{}].consumesCounters[{i}].counters",
                    d.name
                ),
            ) {
                Ok(c) => consumes.push(CounterUse {
                    set: u.counter_set.clone(),
                    counters: c,
                    groups: u.compatibility_groups.clone().unwrap_or_default(),
                }),
                Err(e) => {
                    unusable.get_or_insert(e);
                }
            }
        }
        if let Some(e) = unusable {
            // a device whose use cannot be accounted is not offered
            warnings.push(format!("{e}; device {} is not used", d.name));
            continue;
        }
        let multiple = d.allow_multiple_allocations == Some(true);
        let taints = d
            .taints
            .iter()
            .flatten()
            .map(|t| DeviceTaint {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: t.effect.clone(),
            })
            .collect();
        *serial += 1;
        out.push(Device {
            id: DeviceId {
                driver: driver.clone(),
                pool: spec.pool.name.clone(),
                device: d.name.clone(),
            },
            node,
            selector,
            cel: super::cel::device_value_with(driver, &attributes, &capacity, multiple),
            attributes,
            capacity,
            taints,
            serial: *serial,
            consumes,
            multiple,
            capacity_info,
            binding: super::BindingConditions {
                wait_for: d.binding_conditions.clone().unwrap_or_default(),
                fail_on: d.binding_failure_conditions.clone().unwrap_or_default(),
            },
        });
    }
    (out, warnings)
}

/// A `DeviceTaintRule` as the allocator applies it.
pub fn taint_rule(r: &k8s_openapi::api::resource::v1::DeviceTaintRule) -> super::TaintRule {
    let sel = r.spec.device_selector.as_ref();
    let field = |f: fn(&k8s_openapi::api::resource::v1::DeviceTaintSelector) -> Option<&String>| {
        sel.and_then(f).filter(|v| !v.is_empty()).cloned()
    };
    super::TaintRule {
        driver: field(|s| s.driver.as_ref()),
        pool: field(|s| s.pool.as_ref()),
        device: field(|s| s.device.as_ref()),
        taint: DeviceTaint {
            key: r.spec.taint.key.clone(),
            value: r.spec.taint.value.clone().unwrap_or_default(),
            effect: r.spec.taint.effect.clone(),
        },
    }
}

fn selectors(s: Option<&Vec<DeviceSelector>>) -> Vec<String> {
    s.into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
        .collect()
}

fn tolerations(
    t: Option<&Vec<k8s_openapi::api::resource::v1::DeviceToleration>>,
) -> Vec<DeviceToleration> {
    t.into_iter()
        .flatten()
        .map(|t| DeviceToleration {
            key: t.key.clone().unwrap_or_default(),
            exists: t.operator.as_deref() == Some("Exists"),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone().unwrap_or_default(),
        })
        .collect()
}

fn count(mode: Option<&str>, count: Option<i64>, field: &str) -> Result<Count, String> {
    match mode.unwrap_or("ExactCount") {
        "ExactCount" => match count.unwrap_or(1) {
            n @ 1..=128 => Ok(Count::Exact(n as u32)),
            n => Err(format!("{field}.count: {n} is not between 1 and 128")),
        },
        "All" => Ok(Count::All),
        m => Err(format!(
            "{field}.allocationMode: {m:?} is not ExactCount or All"
        )),
    }
}

/// `capacity.requests` in milli-units.
fn capacity_requests(
    c: Option<&k8s_openapi::api::resource::v1::CapacityRequirements>,
    field: &str,
) -> Result<BTreeMap<String, i128>, String> {
    c.and_then(|c| c.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, q)| {
            let f = format!("{field}.requests[{k}]");
            let v = milli(q, &f)?;
            // a negative amount would give capacity back (#38)
            if v < 0 {
                return Err(format!("{f}: {:?} is negative", q.0));
            }
            Ok((k.clone(), v))
        })
        .collect()
}

/// A DeviceClass.
pub fn class(c: &DeviceClass) -> Class {
    Class {
        name: c.metadata.name.clone().unwrap_or_default(),
        selectors: selectors(c.spec.as_ref().and_then(|s| s.selectors.as_ref())),
        extended_resource: c
            .spec
            .as_ref()
            .and_then(|s| s.extended_resource_name.clone())
            .filter(|n| !n.is_empty()),
        created_ns: c
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_nanosecond()),
    }
}

/// A ResourceClaim.
pub fn claim(c: &ResourceClaim) -> Claim {
    let namespace = c.metadata.namespace.clone().unwrap_or_default();
    let name = c.metadata.name.clone().unwrap_or_default();
    let obj = format!("ResourceClaim {namespace}/{name}");
    let devices = c.spec.as_ref().and_then(|s| s.devices.as_ref());
    let requests = (|| {
        let mut out = Vec::new();
        for (i, r) in devices
            .and_then(|d| d.requests.as_ref())
            .into_iter()
            .flatten()
            .enumerate()
        {
            let field = format!("{obj}: spec.devices.requests[{i}]");
            let alternatives = match (&r.exactly, &r.first_available) {
                (Some(e), None) => {
                    vec![SubRequest {
                        name: r.name.clone(),
                        class: e.device_class_name.clone(),
                        selectors: selectors(e.selectors.as_ref()),
                        count: count(
                            e.allocation_mode.as_deref(),
                            e.count,
                            &format!("{field}.exactly"),
                        )?,
                        admin: e.admin_access == Some(true),
                        tolerations: tolerations(e.tolerations.as_ref()),
                        capacity: capacity_requests(
                            e.capacity.as_ref(),
                            &format!("{field}.exactly.capacity"),
                        )?,
                    }]
                }
                (None, Some(subs)) if !subs.is_empty() => {
                    let mut alts = Vec::new();
                    for (j, s) in subs.iter().enumerate() {
                        let sf = format!("{field}.firstAvailable[{j}]");
                        alts.push(SubRequest {
                            name: format!("{}/{}", r.name, s.name),
                            class: s.device_class_name.clone(),
                            selectors: selectors(s.selectors.as_ref()),
                            count: count(s.allocation_mode.as_deref(), s.count, &sf)?,
                            admin: false,
                            tolerations: tolerations(s.tolerations.as_ref()),
                            capacity: capacity_requests(
                                s.capacity.as_ref(),
                                &format!("{sf}.capacity"),
                            )?,
                        });
                    }
                    alts
                }
                _ => {
                    return Err(format!(
                        "{field}: exactly one of exactly and firstAvailable must be set"
                    ));
                }
            };
            out.push(Request {
                name: r.name.clone(),
                alternatives,
            });
        }
        Ok(out)
    })();
    let constraints = devices
        .and_then(|d| d.constraints.as_ref())
        .into_iter()
        .flatten()
        .map(|k| Constraint {
            requests: k.requests.clone().unwrap_or_default(),
            match_attribute: k.match_attribute.clone(),
            distinct_attribute: k.distinct_attribute.clone(),
        })
        .collect();
    let status = c.status.as_ref();
    let allocation = status.and_then(|s| s.allocation.as_ref()).map(|a| {
        let node = a
            .node_selector
            .as_ref()
            .and_then(|ns| ns.node_selector_terms.first())
            .and_then(|t| {
                t.match_fields
                    .iter()
                    .flatten()
                    .chain(t.match_expressions.iter().flatten())
                    .find(|r| {
                        (r.key == "metadata.name" || r.key == "kubernetes.io/hostname")
                            && r.operator == "In"
                    })
                    .and_then(|r| r.values.as_ref()?.first().cloned())
            });
        let devices = a
            .devices
            .as_ref()
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .map(|r| AllocatedDevice {
                request: r.request.clone(),
                id: DeviceId {
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                },
                admin: r.admin_access == Some(true),
                consumed: r
                    .consumed_capacity
                    .iter()
                    .flatten()
                    .filter_map(|(k, q)| {
                        Some((
                            k.clone(),
                            gpusched_model::Quantity::parse(&q.0).ok()?.milli(),
                        ))
                    })
                    .collect(),
                share: r.share_id.clone(),
                binding: super::BindingConditions {
                    wait_for: r.binding_conditions.clone().unwrap_or_default(),
                    fail_on: r.binding_failure_conditions.clone().unwrap_or_default(),
                },
            })
            .collect();
        Allocation { node, devices }
    });
    let reserved_for = status
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods")
        .map(|r| r.uid.clone())
        .collect();
    Claim {
        namespace,
        name,
        uid: c.metadata.uid.clone().unwrap_or_default(),
        requests,
        constraints,
        allocation,
        reserved_for,
        deleting: c.metadata.deletion_timestamp.is_some(),
    }
}

/// The claims a pod references (none: not a DRA pod). A template entry
/// whose `status.resourceClaimStatuses` entry has no claim name needed no
/// claim (the API's meaning of an unset name): it is left out, not waited
/// for.
pub fn pod_claims(p: &Pod) -> Vec<PodClaim> {
    let statuses: BTreeMap<&str, Option<&String>> = p
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_ref()))
        .collect();
    // KEP-5004: the special claim made for its extended resources
    let special = p
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .filter(|s| !s.resource_claim_name.is_empty())
        .map(|s| PodClaim {
            entry: super::extended::IN_MEMORY_NAME.to_string(),
            claim: Some(s.resource_claim_name.clone()),
        });
    p.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let claim = match &c.resource_claim_name {
                Some(n) => Some(n.clone()),
                None => match statuses.get(c.name.as_str()) {
                    // generated, or not yet
                    Some(Some(n)) => Some((*n).clone()),
                    None => None,
                    // no claim was needed for this entry
                    Some(None) => return None,
                },
            };
            Some(PodClaim {
                entry: c.name.clone(),
                claim,
            })
        })
        .chain(special)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_entries_wait_for_their_claim_unless_none_was_needed() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "direct", "resourceClaimName": "c0"},
                {"name": "made", "resourceClaimTemplateName": "t"},
                {"name": "later", "resourceClaimTemplateName": "t"},
                {"name": "unneeded", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [
                {"name": "made", "resourceClaimName": "p-made-x1"},
                {"name": "unneeded"}]}
        }))
        .unwrap();
        let got: Vec<(String, Option<String>)> = pod_claims(&pod)
            .into_iter()
            .map(|c| (c.entry, c.claim))
            .collect();
        assert_eq!(
            got,
            vec![
                ("direct".into(), Some("c0".into())),
                ("made".into(), Some("p-made-x1".into())),
                ("later".into(), None),
            ]
        );
    }
}
