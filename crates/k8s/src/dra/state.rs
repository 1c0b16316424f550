//! The DRA objects the scheduler knows, and what follows from them for a
//! pending pod: on which nodes its claims can be allocated, and the
//! allocation itself once the core has picked a node.

use super::alloc::{self, Inputs};
use super::cel::Selectors;
use super::{
    AllocatedDevice, Allocation, Claim, Class, CounterSetId, Counters, Device, DeviceId, PodClaim,
};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

mod eligible;
mod pods;
pub use eligible::ClaimGpusMemo;

/// An allocation made in this run and not yet seen in the claim's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tentative {
    /// The pod it was made for.
    pub pod: String,
    /// The allocation.
    pub allocation: Allocation,
}

/// What the scheduler writes to one claim before binding a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimWrite {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid` (the write is refused if the claim was replaced).
    pub uid: String,
    /// The allocation to write (`None`: already allocated, only reserve).
    pub allocate: Option<Allocation>,
    /// KEP-5004: the claim does not exist yet; it is created (with these
    /// requests, for the pod) before it is allocated, and the pod's
    /// `status.extendedResourceClaimStatus` names it.
    pub extended: Option<Vec<super::extended::ExtendedRequest>>,
}

/// Where a pending pod's claims stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodClaims {
    /// No claims.
    None,
    /// A claim does not exist yet (or its template's claim was not made
    /// yet): the pod waits.
    Waiting(String),
    /// The claims cannot be allocated on any node: why.
    Unallocatable(String),
    /// The nodes on which they can, sorted, and the GPUs
    /// ([`super::gpus`]) they take (the least any of those nodes gives
    /// them; none when every claim is allocated already).
    Nodes(Vec<String>, ClaimDemand),
}

/// What a pending pod's claims ask of the core's GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimDemand {
    /// Whole GPUs, a share of one shared GPU, or (with [`ClaimDemand::mig`])
    /// the measure of MIG instances.
    pub gpu: gpusched_model::GpuRequest,
    /// MIG instances of one profile of one GPU in MIG mode.
    pub mig: Option<gpusched_model::MigAsk>,
}

/// The DRA objects, by key.
#[derive(Clone, Debug, Default)]
pub struct DraState {
    /// ResourceClaims by `namespace/name`.
    claims: BTreeMap<String, Claim>,
    /// Devices by ResourceSlice name.
    slices: BTreeMap<String, Vec<Device>>,
    /// What could not be read of each slice.
    slice_warnings: BTreeMap<String, Vec<String>>,
    /// Each slice's devices' own taints (the slice's), by slice name, in
    /// device order: `slices` holds these plus the matching rules' taints.
    own_taints: BTreeMap<String, Vec<Vec<super::DeviceTaint>>>,
    /// DeviceTaintRules by name.
    taint_rules: BTreeMap<String, super::TaintRule>,
    /// DeviceClasses by name.
    classes: BTreeMap<String, Class>,
    /// Counter sets (`sharedCounters`) by slice name.
    slice_counters: BTreeMap<String, Vec<(CounterSetId, Counters)>>,
    /// Counter sets by id (from the slices, the first slice by name
    /// winning should two publish one set).
    counter_sets: BTreeMap<CounterSetId, Counters>,
    /// Allocations made and not yet seen, by claim key.
    tentative: BTreeMap<String, Tentative>,
    serial: u64,
    selectors: Arc<Mutex<Selectors>>,
    /// Index: slice names by the node their devices are on (`None`: all).
    slices_on: BTreeMap<Option<String>, BTreeSet<String>>,
    /// Index: keys of allocated claims by their allocation's node.
    allocated_on: BTreeMap<Option<String>, BTreeSet<String>>,
    /// Index: keys of tentative allocations by their node.
    tentative_on: BTreeMap<Option<String>, BTreeSet<String>>,
    /// Which devices are GPUs: the configured drivers and those of the
    /// classes mapping a GPU resource name ([`super::gpus::class_gpu_drivers`]).
    gpu_drivers: super::gpus::GpuDrivers,
    /// The drivers configured (`--dra-gpu-driver`, else gpusched's own).
    configured_gpu_drivers: super::gpus::GpuDrivers,
    /// The nodes' labels, for devices with a node selector.
    node_labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl DraState {
    /// Which drivers' devices are the core's GPUs ([`super::gpus`]).
    pub fn set_gpu_drivers(&mut self, drivers: super::gpus::GpuDrivers) {
        self.configured_gpu_drivers = drivers;
        self.derive_gpu_drivers();
    }

    /// The GPU drivers again from the configured ones and the classes;
    /// whether they changed.
    fn derive_gpu_drivers(&mut self) -> bool {
        let derived = super::gpus::class_gpu_drivers(self.classes.values());
        let now = self
            .configured_gpu_drivers
            .with(derived.iter().map(String::as_str));
        if now == self.gpu_drivers {
            return false;
        }
        self.gpu_drivers = now;
        true
    }

    /// Which drivers' devices are the core's GPUs.
    pub fn gpu_drivers(&self) -> &super::gpus::GpuDrivers {
        &self.gpu_drivers
    }

    /// The GPU devices of `node` in the core's GPU order: position `i` of
    /// the node's GPUs in the core is the `i`-th.
    pub fn gpu_devices_on(&self, node: &str) -> Vec<&Device> {
        let mut v: Vec<&Device> = self
            .slices_on
            .get(&Some(node.to_string()))
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .flatten()
            .filter(|d| d.node.as_deref() == Some(node) && self.gpu_drivers.is_gpu(d))
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v.dedup_by(|a, b| a.id == b.id);
        super::gpus::order(&mut v);
        v
    }

    /// The core's GPUs of `node` ([`super::gpus::core_gpus`]): its GPU
    /// devices in the core's order, then its GPUs in MIG mode (from their
    /// instances and counter sets).
    pub fn core_gpus_on(&self, node: &str) -> Vec<super::gpus::CoreGpu<'_>> {
        let devices = self.gpu_devices_on(node);
        let mut instances: Vec<&Device> = self
            .slices_on
            .get(&Some(node.to_string()))
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .flatten()
            .filter(|d| d.node.as_deref() == Some(node) && self.gpu_drivers.is_mig(d))
            .collect();
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        instances.dedup_by(|a, b| a.id == b.id);
        super::gpus::core_gpus(&devices, &instances, &self.counter_sets)
    }

    /// The counter sets of the pools, by id.
    pub fn counter_sets(&self) -> &BTreeMap<CounterSetId, Counters> {
        &self.counter_sets
    }

    /// Records a node's labels (`None`: the node is gone), which devices
    /// with a node selector are matched against. Returns whether that
    /// changed what such a device is available on (some device has a
    /// selector and the labels changed).
    pub fn set_node_labels(
        &mut self,
        node: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> bool {
        let changed = match labels {
            Some(l) => self.node_labels.get(node) != Some(l),
            None => self.node_labels.contains_key(node),
        };
        match labels {
            Some(l) => {
                self.node_labels.insert(node.to_string(), l.clone());
            }
            None => {
                self.node_labels.remove(node);
            }
        }
        changed
            && self
                .slices_on
                .get(&None)
                .into_iter()
                .flatten()
                .filter_map(|s| self.slices.get(s))
                .flatten()
                .any(|d| d.selector.is_some())
    }

    /// Whether device `d` is available on `node`: on it, on all nodes, or
    /// selected by its node selector (by the node's name and labels).
    pub fn available_on(&self, d: &Device, node: &str) -> bool {
        match (&d.node, &d.selector) {
            (Some(n), _) => n == node,
            (None, None) => true,
            (None, Some(terms)) => self
                .node_labels
                .get(node)
                .is_some_and(|l| terms.iter().any(|t| t.matches(node, l))),
        }
    }

    /// The nodes a slice's devices are on (several with
    /// `perDeviceNodeSelection`; none for an unknown slice, or devices of
    /// all nodes or a node selector).
    pub fn slice_node(&self, name: &str) -> Vec<String> {
        slice_places(self.slices.get(name).map_or(&[][..], Vec::as_slice))
            .into_iter()
            .flatten()
            .collect()
    }

    /// The nodes some slice is on.
    pub fn slice_nodes(&self) -> Vec<String> {
        self.slices_on.keys().flatten().cloned().collect()
    }

    /// The pod a claim's devices are counted on in the core: the first pod
    /// in its `status.reservedFor`, or the pod of this run's tentative
    /// allocation. `None`: allocated and reserved for no pod.
    fn owner(&self, key: &str) -> Option<&str> {
        match self.claims.get(key) {
            Some(c) if c.allocation.is_some() => c.reserved_for.first().map(String::as_str),
            _ => self.tentative.get(key).map(|t| t.pod.as_str()),
        }
    }

    /// Every device held (allocated claims and tentative allocations,
    /// admin access aside) with the pod it is counted on.
    pub fn held(&self) -> Vec<(&DeviceId, Option<&str>)> {
        self.held_results()
            .into_iter()
            .map(|(d, o)| (&d.id, o))
            .collect()
    }

    /// [`DraState::held`] with each allocation result (what it consumes
    /// of a device allowing several allocations).
    pub fn held_results(&self) -> Vec<(&AllocatedDevice, Option<&str>)> {
        let mut out = Vec::new();
        for (k, c) in &self.claims {
            if let Some(a) = &c.allocation {
                let owner = self.owner(k);
                out.extend(a.devices.iter().filter(|d| !d.admin).map(|d| (d, owner)));
            }
        }
        for t in self.tentative.values() {
            out.extend(
                t.allocation
                    .devices
                    .iter()
                    .filter(|d| !d.admin)
                    .map(|d| (d, Some(t.pod.as_str()))),
            );
        }
        out
    }

    /// The devices counted on pod `uid` (in namespace `ns`, with these
    /// claims): those of its claims whose owner it is.
    pub fn held_by(&self, uid: &str, ns: &str, claims: &[PodClaim]) -> Vec<&DeviceId> {
        self.held_results_by(uid, ns, claims)
            .into_iter()
            .map(|d| &d.id)
            .collect()
    }

    /// [`DraState::held_by`] with each allocation result.
    pub fn held_results_by(
        &self,
        uid: &str,
        ns: &str,
        claims: &[PodClaim],
    ) -> Vec<&AllocatedDevice> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for pc in claims {
            let Some(name) = &pc.claim else { continue };
            let k = format!("{ns}/{name}");
            if !seen.insert(k.clone()) || self.owner(&k) != Some(uid) {
                continue;
            }
            if let Some(a) = self.allocation_of(&k) {
                out.extend(a.devices.iter().filter(|d| !d.admin));
            }
        }
        // KEP-5004: its special claim, while it is only ours in memory
        if let Some(t) = self.tentative.get(&super::extended::special_key(ns, uid))
            && t.pod == uid
        {
            out.extend(t.allocation.devices.iter().filter(|d| !d.admin));
        }
        out
    }

    /// A ResourceClaim was added or changed.
    pub fn upsert_claim(&mut self, raw: &ResourceClaim) {
        let c = super::translate::claim(raw);
        let k = c.key();
        // KEP-5004: the special claim we created shows its allocation:
        // what was held for it in memory is let go
        if c.allocation.is_some()
            && raw
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(super::extended::CLAIM_ANNOTATION))
                .is_some_and(|v| v == "true")
        {
            for o in raw.metadata.owner_references.iter().flatten() {
                if o.controller == Some(true) {
                    self.drop_tentative(&super::extended::special_key(&c.namespace, &o.uid));
                }
            }
        }
        self.unindex_claim(&k);
        if let Some(a) = &c.allocation {
            self.allocated_on
                .entry(a.node.clone())
                .or_default()
                .insert(k.clone());
        }
        if c.allocation.is_some()
            || self
                .tentative
                .get(&k)
                .is_some_and(|t| c.reserved_for.contains(&t.pod))
        {
            self.drop_tentative(&k);
        }
        self.claims.insert(k, c);
    }

    /// A ResourceClaim is gone.
    pub fn delete_claim(&mut self, key: &str) {
        self.unindex_claim(key);
        self.claims.remove(key);
        self.drop_tentative(key);
    }

    /// A ResourceSlice was added or changed.
    pub fn upsert_slice(&mut self, s: &ResourceSlice) {
        let name = s.metadata.name.clone().unwrap_or_default();
        let (mut devices, mut warnings) = super::translate::slice(s, &mut self.serial);
        let (sets, w) = super::translate::counter_sets(s);
        warnings.extend(w);
        if sets.is_empty() {
            if self.slice_counters.remove(&name).is_some() {
                self.recount();
            }
        } else {
            self.slice_counters.insert(name.clone(), sets);
            self.recount();
        }
        self.own_taints.insert(
            name.clone(),
            devices.iter().map(|d| d.taints.clone()).collect(),
        );
        for d in &mut devices {
            d.taints.extend(rule_taints(&self.taint_rules, &d.id));
        }
        self.unindex_slice(&name);
        // each device under its own node (#38: `perDeviceNodeSelection`)
        for node in slice_places(&devices) {
            self.slices_on.entry(node).or_default().insert(name.clone());
        }
        self.slices.insert(name.clone(), devices);
        if warnings.is_empty() {
            self.slice_warnings.remove(&name);
        } else {
            self.slice_warnings.insert(name, warnings);
        }
    }

    /// A ResourceSlice is gone.
    pub fn delete_slice(&mut self, name: &str) {
        self.unindex_slice(name);
        self.slices.remove(name);
        self.slice_warnings.remove(name);
        self.own_taints.remove(name);
        if self.slice_counters.remove(name).is_some() {
            self.recount();
        }
    }

    /// The counter sets again from the slices'.
    fn recount(&mut self) {
        self.counter_sets.clear();
        for sets in self.slice_counters.values() {
            for (id, c) in sets {
                self.counter_sets
                    .entry(id.clone())
                    .or_insert_with(|| c.clone());
            }
        }
    }

    /// What allocations (held and tentative) consume of the devices on
    /// `node` that allow multiple allocations (none: an empty map).
    /// `core_pods`: leave out what shared GPUs give pods the core counts
    /// (whether those shares are free is the core's question).
    fn shared_on(
        &self,
        node: &str,
        devices: &[&Device],
        core_pods: Option<&BTreeSet<String>>,
    ) -> BTreeMap<DeviceId, Counters> {
        let mut out: BTreeMap<DeviceId, Counters> = BTreeMap::new();
        if !devices.iter().any(|d| d.multiple) {
            return out;
        }
        let multiple: BTreeMap<&DeviceId, &Device> = devices
            .iter()
            .filter(|d| d.multiple)
            .map(|d| (&d.id, *d))
            .collect();
        let allocated = [Some(node.to_string()), None]
            .iter()
            .filter_map(|k| self.allocated_on.get(k))
            .flatten()
            .filter_map(|k| {
                let a = self.claims.get(k)?.allocation.as_ref()?;
                Some((a, self.owner(k)))
            })
            .collect::<Vec<_>>();
        let tentative = [Some(node.to_string()), None]
            .into_iter()
            .filter_map(|k| self.tentative_on.get(&k))
            .flatten()
            .filter_map(|k| self.tentative.get(k))
            .map(|t| (&t.allocation, Some(t.pod.as_str())));
        // a shared device offered here but not the node's own (all nodes,
        // a node selector) may be used by allocations for other nodes:
        // all are looked at (#38)
        let everywhere: Vec<(&Allocation, Option<&str>)> =
            if multiple.values().any(|d| d.node.is_none()) {
                self.claims
                    .iter()
                    .filter_map(|(k, c)| Some((c.allocation.as_ref()?, self.owner(k))))
                    .chain(
                        self.tentative
                            .values()
                            .map(|t| (&t.allocation, Some(t.pod.as_str()))),
                    )
                    .collect()
            } else {
                allocated.into_iter().chain(tentative).collect()
            };
        for (a, owner) in everywhere {
            let in_core = owner.is_some_and(|o| core_pods.is_some_and(|c| c.contains(o)));
            for r in a.devices.iter().filter(|r| !r.admin) {
                let Some(d) = multiple.get(&r.id) else {
                    continue;
                };
                if in_core && self.gpu_drivers.is_gpu(d) {
                    continue;
                }
                let e = out.entry(r.id.clone()).or_default();
                if r.consumed.is_empty() {
                    // a result without amounts (written before the device
                    // allowed sharing): it holds the whole device
                    for (k, v) in &d.capacity {
                        *e.entry(k.clone()).or_insert(0) += v;
                    }
                }
                for (k, v) in &r.consumed {
                    *e.entry(super::translate::qualify(&r.id.driver, k))
                        .or_insert(0) += v;
                }
            }
        }
        out
    }

    /// A DeviceTaintRule was added or changed: its taint is on every
    /// device it selects, as if the slice carried it.
    pub fn upsert_taint_rule(&mut self, r: &k8s_openapi::api::resource::v1::DeviceTaintRule) {
        let name = r.metadata.name.clone().unwrap_or_default();
        self.taint_rules
            .insert(name, super::translate::taint_rule(r));
        self.retaint();
    }

    /// A DeviceTaintRule is gone.
    pub fn delete_taint_rule(&mut self, name: &str) {
        if self.taint_rules.remove(name).is_some() {
            self.retaint();
        }
    }

    /// Names of DeviceTaintRules.
    pub fn taint_rule_keys(&self) -> Vec<String> {
        self.taint_rules.keys().cloned().collect()
    }

    /// Every device's taints again: its slice's own plus the rules'.
    fn retaint(&mut self) {
        for (name, devices) in &mut self.slices {
            let own = self.own_taints.get(name);
            for (i, d) in devices.iter_mut().enumerate() {
                d.taints = own.and_then(|o| o.get(i)).cloned().unwrap_or_default();
                d.taints.extend(rule_taints(&self.taint_rules, &d.id));
            }
        }
    }

    fn unindex_claim(&mut self, key: &str) {
        if let Some(a) = self.claims.get(key).and_then(|c| c.allocation.as_ref())
            && let Some(set) = self.allocated_on.get_mut(&a.node)
        {
            set.remove(key);
        }
    }

    fn unindex_slice(&mut self, name: &str) {
        if let Some(d) = self.slices.get(name) {
            for node in slice_places(d) {
                if let Some(set) = self.slices_on.get_mut(&node) {
                    set.remove(name);
                }
            }
        }
    }

    /// The devices usable on `node` (its own and all-node ones), sorted.
    pub fn devices_on(&self, node: &str) -> Vec<&Device> {
        let mut out: Vec<&Device> = [Some(node.to_string()), None]
            .iter()
            .filter_map(|k| self.slices_on.get(k))
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .flatten()
            .filter(|d| self.available_on(d, node))
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out.dedup_by(|a, b| a.id == b.id);
        out
    }

    /// Devices held on `node` (or by all-node allocations), allocated or
    /// tentatively, admin access aside; a device offered here but not the
    /// node's own (`allNodes`, a node selector) is held whichever node the
    /// allocation holding it is for (#38: one device, two claims).
    pub fn in_use_on(&self, node: &str) -> BTreeSet<DeviceId> {
        let mut out = BTreeSet::new();
        let on = |n: &Option<String>| n.as_deref().is_none_or(|n| n == node);
        for k in [Some(node.to_string()), None]
            .iter()
            .filter_map(|k| self.allocated_on.get(k))
            .flatten()
        {
            if let Some(a) = self.claims.get(k).and_then(|c| c.allocation.as_ref()) {
                out.extend(a.devices.iter().filter(|d| !d.admin).map(|d| d.id.clone()));
            }
        }
        let tentative = [Some(node.to_string()), None]
            .into_iter()
            .filter_map(|k| self.tentative_on.get(&k))
            .flatten()
            .filter_map(|k| self.tentative.get(k));
        for t in tentative.filter(|t| on(&t.allocation.node)) {
            out.extend(
                t.allocation
                    .devices
                    .iter()
                    .filter(|d| !d.admin)
                    .map(|d| d.id.clone()),
            );
        }
        // devices offered here but not the node's own may be held by an
        // allocation for another node
        let shared = self.offered_not_own(node);
        if !shared.is_empty() {
            out.extend(
                self.all_allocations()
                    .flat_map(|a| &a.devices)
                    .filter(|d| !d.admin && shared.contains(&d.id))
                    .map(|d| d.id.clone()),
            );
        }
        out
    }

    /// The devices available on `node` that are not its own: of all nodes,
    /// or selected by a node selector.
    fn offered_not_own(&self, node: &str) -> BTreeSet<&DeviceId> {
        self.slices_on
            .get(&None)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .flatten()
            .filter(|d| d.node.is_none() && self.available_on(d, node))
            .map(|d| &d.id)
            .collect()
    }

    /// Every allocation: the claims' and this run's tentative ones.
    fn all_allocations(&self) -> impl Iterator<Item = &Allocation> {
        self.claims
            .values()
            .filter_map(|c| c.allocation.as_ref())
            .chain(self.tentative.values().map(|t| &t.allocation))
    }

    /// A DeviceClass was added or changed; whether the GPU drivers
    /// changed with it (a class mapping `nvidia.com/gpu` makes its
    /// driver's devices GPUs).
    pub fn upsert_class(&mut self, c: &DeviceClass) -> bool {
        let c = super::translate::class(c);
        self.classes.insert(c.name.clone(), c);
        self.derive_gpu_drivers()
    }

    /// A DeviceClass is gone; whether the GPU drivers changed.
    pub fn delete_class(&mut self, name: &str) -> bool {
        self.classes.remove(name);
        self.derive_gpu_drivers()
    }

    /// Keys of claims (`namespace/name`), slices or classes.
    pub fn claim_keys(&self) -> Vec<String> {
        self.claims.keys().cloned().collect()
    }
    /// Names of slices.
    pub fn slice_keys(&self) -> Vec<String> {
        self.slices.keys().cloned().collect()
    }
    /// Names of classes.
    pub fn class_keys(&self) -> Vec<String> {
        self.classes.keys().cloned().collect()
    }

    /// A claim by `namespace/name`.
    pub fn claim(&self, key: &str) -> Option<&Claim> {
        self.claims.get(key)
    }

    /// What could not be read of the slices.
    pub fn warnings(&self) -> impl Iterator<Item = &String> {
        self.slice_warnings.values().flatten()
    }

    /// A pod is gone or its binding failed: its tentative allocations are
    /// dropped.
    pub fn forget_pod(&mut self, uid: &str) {
        let keys: Vec<String> = self
            .tentative
            .iter()
            .filter(|(_, t)| t.pod == uid)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.drop_tentative(&k);
        }
    }

    fn drop_tentative(&mut self, key: &str) {
        if let Some(t) = self.tentative.remove(key)
            && let Some(set) = self.tentative_on.get_mut(&t.allocation.node)
        {
            set.remove(key);
        }
    }

    fn add_tentative(&mut self, key: String, t: Tentative) {
        self.drop_tentative(&key);
        self.tentative_on
            .entry(t.allocation.node.clone())
            .or_default()
            .insert(key.clone());
        self.tentative.insert(key, t);
    }

    /// Number of allocations made and not yet seen.
    pub fn tentative_len(&self) -> usize {
        self.tentative.len()
    }

    /// The allocation of a claim: its status', else this run's tentative one.
    fn allocation_of(&self, key: &str) -> Option<&Allocation> {
        self.claims
            .get(key)
            .and_then(|c| c.allocation.as_ref())
            .or_else(|| self.tentative.get(key).map(|t| &t.allocation))
    }

    /// Devices held: by allocated claims and tentative allocations
    /// (admin-access devices are not held).
    pub fn in_use(&self) -> BTreeSet<DeviceId> {
        let mut out = BTreeSet::new();
        for c in self.claims.values() {
            if let Some(a) = &c.allocation {
                out.extend(a.devices.iter().filter(|d| !d.admin).map(|d| d.id.clone()));
            }
        }
        for t in self.tentative.values() {
            out.extend(
                t.allocation
                    .devices
                    .iter()
                    .filter(|d| !d.admin)
                    .map(|d| d.id.clone()),
            );
        }
        out
    }

    /// Devices by the node they are on (sorted by id); devices of every
    /// node are under `None`.
    pub fn devices_by_node(&self) -> BTreeMap<Option<&str>, Vec<&Device>> {
        let mut out: BTreeMap<Option<&str>, Vec<&Device>> = BTreeMap::new();
        for d in self.slices.values().flatten() {
            out.entry(d.node.as_deref()).or_default().push(d);
        }
        for v in out.values_mut() {
            v.sort_by(|a, b| a.id.cmp(&b.id));
            v.dedup_by(|a, b| a.id == b.id);
        }
        out
    }
}

/// The places a slice's devices are on: their nodes, and `None` when one
/// is on every node or the nodes of a selector.
fn slice_places(devices: &[Device]) -> BTreeSet<Option<String>> {
    devices.iter().map(|d| d.node.clone()).collect()
}

/// The taints of the rules that select device `id`, in rule-name order.
fn rule_taints<'a>(
    rules: &'a BTreeMap<String, super::TaintRule>,
    id: &'a super::DeviceId,
) -> impl Iterator<Item = super::DeviceTaint> + 'a {
    rules
        .values()
        .filter(move |r| r.matches(id))
        .map(|r| r.taint.clone())
}
