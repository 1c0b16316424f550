//! Dynamic Resource Allocation (`resource.k8s.io/v1`, structured
//! parameters): the scheduler's view of DeviceClasses, ResourceSlices and
//! ResourceClaims, translated from the API objects ([`translate`]), the CEL
//! selectors ([`cel`]) and the allocator ([`alloc`]).
//!
//! Everything here is pure and deterministic: devices, claims and classes
//! are kept in ordered maps, candidates are tried in device order, and no
//! clock is read.

pub mod alloc;
pub mod cel;
pub mod extended;
pub mod gpus;
pub mod state;
pub mod translate;

use std::collections::BTreeMap;

/// The finalizer a claim carries while it is allocated (kube-scheduler's
/// name; kube-controller-manager removes it when it deallocates).
pub const FINALIZER: &str = "resource.kubernetes.io/delete-protection";

/// The standard attribute domain (`resource.kubernetes.io/pcieRoot`).
pub const STANDARD_DOMAIN: &str = "resource.kubernetes.io";

/// A device, by driver, pool and name (as an allocation result names it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId {
    /// The driver (`spec.driver` of its slice).
    pub driver: String,
    /// The pool (`spec.pool.name`).
    pub pool: String,
    /// The device's name in its pool.
    pub device: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// A device attribute's value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AttrValue {
    /// `bool`.
    Bool(bool),
    /// `int`.
    Int(i64),
    /// `string`.
    Str(String),
    /// `version` (semantic version text).
    Version(String),
}

/// A device taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTaint {
    /// `key`.
    pub key: String,
    /// `value` (empty when absent).
    pub value: String,
    /// `NoSchedule`, `NoExecute` or `None` (informational).
    pub effect: String,
}

/// A `DeviceTaintRule`: its taint on every device its selector matches
/// (`driver`, `pool`, `device`; each one given must be equal, none given
/// matches every device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaintRule {
    /// `spec.deviceSelector.driver`.
    pub driver: Option<String>,
    /// `spec.deviceSelector.pool`.
    pub pool: Option<String>,
    /// `spec.deviceSelector.device`.
    pub device: Option<String>,
    /// `spec.taint`.
    pub taint: DeviceTaint,
}

impl TaintRule {
    /// Whether the rule's selector matches the device.
    pub fn matches(&self, id: &DeviceId) -> bool {
        self.driver.as_ref().is_none_or(|d| *d == id.driver)
            && self.pool.as_ref().is_none_or(|p| *p == id.pool)
            && self.device.as_ref().is_none_or(|d| *d == id.device)
    }
}

/// A toleration of device taints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceToleration {
    /// `key` (empty: every key, with `Exists`).
    pub key: String,
    /// `Exists` or `Equal`.
    pub exists: bool,
    /// `value`.
    pub value: String,
    /// `effect` (empty: every effect).
    pub effect: String,
}

impl DeviceToleration {
    /// Whether this tolerates `t`.
    pub fn tolerates(&self, t: &DeviceTaint) -> bool {
        if !self.effect.is_empty() && self.effect != t.effect {
            return false;
        }
        if self.key.is_empty() {
            return self.exists;
        }
        self.key == t.key && (self.exists || self.value == t.value)
    }
}

/// One device of a ResourceSlice, as the allocator sees it.
#[derive(Clone, Debug)]
pub struct Device {
    /// Driver, pool, name.
    pub id: DeviceId,
    /// The node it is on (`None`: any node, `allNodes`, or the nodes of
    /// [`Device::selector`]).
    pub node: Option<String>,
    /// A slice's `nodeSelector` (or the device's own, with
    /// `perDeviceNodeSelection`): the device is available on every node
    /// one of these terms matches (`node` is `None`).
    pub selector: Option<Vec<gpusched_model::NodeSelectorTerm>>,
    /// Attributes by qualified name (`domain/name`; a name without a
    /// domain is in the driver's).
    pub attributes: BTreeMap<String, AttrValue>,
    /// Capacities by qualified name, in milli-units.
    pub capacity: BTreeMap<String, i128>,
    /// Taints.
    pub taints: Vec<DeviceTaint>,
    /// The device as CEL's `device` variable (built once).
    pub cel: ::cel::Value,
    /// A number unique to this version of the device (selector results
    /// are cached under it).
    pub serial: u64,
    /// The shared counters it consumes while allocated (partitionable
    /// devices: `consumesCounters`).
    pub consumes: Vec<CounterUse>,
    /// `allowMultipleAllocations`: several requests may share it, each
    /// consuming part of its capacity.
    pub multiple: bool,
    /// Per qualified capacity name: the name as the slice spells it and
    /// its `requestPolicy`.
    pub capacity_info: BTreeMap<String, CapacityInfo>,
    /// `bindingConditions` and `bindingFailureConditions`: the scheduler
    /// binds a pod given this device only once the conditions are true on
    /// its claim's `status.devices`, and gives up on a failure condition.
    pub binding: BindingConditions,
}

/// A device's binding conditions (copied into allocation results).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BindingConditions {
    /// `bindingConditions`: all must be true before the Binding.
    pub wait_for: Vec<String>,
    /// `bindingFailureConditions`: any true fails the binding.
    pub fail_on: Vec<String>,
}

impl BindingConditions {
    /// Whether there is nothing to wait for.
    pub fn is_empty(&self) -> bool {
        self.wait_for.is_empty() && self.fail_on.is_empty()
    }
}

/// Counters by name, in milli-units.
pub type Counters = BTreeMap<String, i128>;

/// A counter set of a pool (`spec.sharedCounters[]` of a slice).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CounterSetId {
    /// The driver.
    pub driver: String,
    /// The pool.
    pub pool: String,
    /// The counter set's name.
    pub name: String,
}

impl std::fmt::Display for CounterSetId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.name)
    }
}

/// What a device consumes of one counter set (`consumesCounters[]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterUse {
    /// `counterSet`: a set of the device's pool.
    pub set: String,
    /// `counters`, in milli-units.
    pub counters: Counters,
    /// `compatibilityGroups`: devices consuming from one set may be
    /// allocated together only if they share a group (or all have none).
    pub groups: Vec<String>,
}

/// A device capacity's name and request policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityInfo {
    /// The name as the slice spells it (allocation results use it).
    pub name: String,
    /// `requestPolicy`.
    pub policy: Option<RequestPolicy>,
}

/// `capacity.<name>.requestPolicy`: how a request's amount is rounded.
/// Amounts in milli-units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPolicy {
    /// `default`: what a request that does not name the capacity consumes
    /// (`None`: the whole capacity).
    pub default: Option<i128>,
    /// `validValues`, ascending: a request takes the smallest one at least
    /// its amount.
    pub values: Vec<i128>,
    /// `validRange`: (`min`, `max`, `step`).
    pub range: Option<(i128, Option<i128>, Option<i128>)>,
}

impl RequestPolicy {
    /// What a request of `amount` (`None`: the request does not name the
    /// capacity) consumes of a capacity of `capacity`; `None` when the
    /// policy does not allow the amount.
    pub fn consumed(
        policy: Option<&RequestPolicy>,
        amount: Option<i128>,
        capacity: i128,
    ) -> Option<i128> {
        let Some(p) = policy else {
            return Some(amount.unwrap_or(capacity));
        };
        let Some(v) = amount.or(p.default) else {
            return Some(capacity);
        };
        if !p.values.is_empty() {
            return p.values.iter().copied().find(|x| *x >= v);
        }
        if let Some((min, max, step)) = p.range {
            let mut v = v.max(min);
            if let Some(s) = step.filter(|s| *s > 0) {
                v = min + (v - min + s - 1) / s * s;
            }
            if max.is_some_and(|m| v > m) {
                return None;
            }
            return Some(v);
        }
        Some(v)
    }
}

impl Device {
    /// Whether a taint with effect `NoSchedule` or `NoExecute` is not
    /// tolerated.
    pub fn untolerated(&self, tolerations: &[DeviceToleration]) -> Option<&DeviceTaint> {
        self.taints.iter().find(|t| {
            (t.effect == "NoSchedule" || t.effect == "NoExecute")
                && !tolerations.iter().any(|tol| tol.tolerates(t))
        })
    }
}

/// How many devices a (sub)request wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// Exactly this many.
    Exact(u32),
    /// Every matching device of the node (at least one).
    All,
}

/// One way to satisfy a request (an `exactly` request has one; a
/// `firstAvailable` request has its subrequests in order of preference).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubRequest {
    /// The name results carry: `request` or `request/subrequest`.
    pub name: String,
    /// `deviceClassName`.
    pub class: String,
    /// CEL selectors of the request itself.
    pub selectors: Vec<String>,
    /// How many.
    pub count: Count,
    /// `adminAccess`: may use devices in use, and is never counted as
    /// holding them.
    pub admin: bool,
    /// Tolerations of device taints.
    pub tolerations: Vec<DeviceToleration>,
    /// `capacity.requests`: amounts (milli-units) by capacity name as the
    /// request spells it (a name without a domain is in the device's
    /// driver's).
    pub capacity: BTreeMap<String, i128>,
}

/// A request of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `name`.
    pub name: String,
    /// Alternatives in order of preference.
    pub alternatives: Vec<SubRequest>,
}

/// A constraint across requests of one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constraint {
    /// The requests it covers (empty: all).
    pub requests: Vec<String>,
    /// `matchAttribute`: the qualified attribute all their devices share.
    pub match_attribute: Option<String>,
    /// `distinctAttribute`: the qualified attribute their devices all differ in.
    pub distinct_attribute: Option<String>,
}

impl Constraint {
    /// Whether the constraint covers the request (or subrequest) `name`.
    pub fn covers(&self, name: &str) -> bool {
        self.requests.is_empty()
            || self.requests.iter().any(|r| {
                r == name
                    || name
                        .split_once('/')
                        .is_some_and(|(parent, _)| parent == r.as_str())
            })
    }
}

/// One allocated device of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// The (sub)request it serves.
    pub request: String,
    /// The device.
    pub id: DeviceId,
    /// Allocated with admin access (does not hold the device).
    pub admin: bool,
    /// On a device that allows multiple allocations: what this allocation
    /// consumes of each capacity (named as the slice names it; every
    /// capacity of the device), in milli-units. Empty otherwise.
    pub consumed: BTreeMap<String, i128>,
    /// On a device that allows multiple allocations: the share's id.
    pub share: Option<String>,
    /// The device's binding conditions at allocation.
    pub binding: BindingConditions,
}

/// A claim's allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The node its devices are on (`None`: no node restriction).
    pub node: Option<String>,
    /// Its devices.
    pub devices: Vec<AllocatedDevice>,
}

/// A ResourceClaim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The requests (`Err`: the claim cannot be used, and why).
    pub requests: Result<Vec<Request>, String>,
    /// The constraints.
    pub constraints: Vec<Constraint>,
    /// `status.allocation`, when allocated.
    pub allocation: Option<Allocation>,
    /// `status.reservedFor`: the pods' uids.
    pub reserved_for: Vec<String>,
    /// Being deleted.
    pub deleting: bool,
}

impl Claim {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A DeviceClass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    /// `metadata.name`.
    pub name: String,
    /// CEL selectors.
    pub selectors: Vec<String>,
    /// `spec.extendedResourceName` (KEP-5004).
    pub extended_resource: Option<String>,
    /// `metadata.creationTimestamp` in nanoseconds since the epoch (0:
    /// unknown); the newest class wins an extended resource name.
    pub created_ns: i128,
}

/// The claims a pod references, by its `spec.resourceClaims` entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClaim {
    /// The entry's `name`.
    pub entry: String,
    /// The claim's name: `resourceClaimName`, or the one
    /// kube-controller-manager generated for a template (from
    /// `status.resourceClaimStatuses`); `None` while it has not yet.
    pub claim: Option<String>,
}
