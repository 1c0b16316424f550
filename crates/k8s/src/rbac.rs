//! What the scheduler asks of the API server, as RBAC rules: every watch
//! and every write of this crate is listed here once, with the module that
//! makes it. The chart's ClusterRole and lease Role must grant exactly this
//! (a test compares them with the rendered manifests), so the installed
//! scheduler can do its work and holds nothing it does not use.

/// One permission: `verbs` on `resource` of API group `group` (`""`: core).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    /// API group.
    pub group: &'static str,
    /// Resource (with `/subresource`).
    pub resource: &'static str,
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// What uses it.
    pub used_by: &'static str,
}

const fn p(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    used_by: &'static str,
) -> Permission {
    Permission {
        group,
        resource,
        verbs,
        used_by,
    }
}

const WATCH: &[&str] = &["list", "watch"];

/// Cluster-wide permissions of the scheduler (its ClusterRole).
pub const CLUSTER: &[Permission] = &[
    p("", "nodes", WATCH, "watch: nodes"),
    p("", "pods", WATCH, "watch: pods"),
    p("", "pods", &["delete"], "exec: preemption, reclaim, moves"),
    p("", "pods/binding", &["create"], "exec: bindings"),
    p(
        "",
        "pods/status",
        &["patch"],
        "exec: PodScheduled condition, nominatedNodeName",
    ),
    p(
        "events.k8s.io",
        "events",
        &["create", "patch"],
        "exec: events",
    ),
    p(
        "scheduling.k8s.io",
        "priorityclasses",
        WATCH,
        "watch: priority classes",
    ),
    p(
        "policy",
        "poddisruptionbudgets",
        WATCH,
        "watch: disruption budgets of victims",
    ),
    p("batch", "jobs", WATCH, "watch: Jobs labelled as gangs"),
    p(
        "",
        "namespaces",
        WATCH,
        "watch: namespace labels for affinity terms' namespaceSelector",
    ),
    p(
        "",
        "persistentvolumeclaims",
        WATCH,
        "watch: pods' PersistentVolumeClaims (volumes)",
    ),
    p(
        "",
        "persistentvolumeclaims",
        &["patch"],
        "exec: volume.kubernetes.io/selected-node on a claim to provision (volumes)",
    ),
    p(
        "",
        "persistentvolumes",
        WATCH,
        "watch: PersistentVolumes (volumes)",
    ),
    p(
        "",
        "persistentvolumes",
        &["patch"],
        "exec: a volume's claimRef before the pod's Binding (volumes)",
    ),
    p(
        "storage.k8s.io",
        "storageclasses",
        WATCH,
        "watch: StorageClasses, binding mode and provisioner (volumes)",
    ),
    p(
        "storage.k8s.io",
        "csinodes",
        WATCH,
        "watch: CSINodes, attach limits per node (volumes)",
    ),
    p(
        "storage.k8s.io",
        "csidrivers",
        WATCH,
        "watch: CSIDrivers, which publish storage capacity (volumes)",
    ),
    p(
        "storage.k8s.io",
        "csistoragecapacities",
        WATCH,
        "watch: CSIStorageCapacities for provisioning (volumes)",
    ),
    p("gpusched.io", "queues", WATCH, "watch: queues"),
    p("gpusched.io", "podgroups", WATCH, "watch: pod groups"),
    p(
        "gpusched.io",
        "podgroups",
        &["create"],
        "watch: a PodGroup for each gang Job",
    ),
    p(
        "gpusched.io",
        "queues",
        &["create"],
        "controller: the queue \"default\" as an object when missing",
    ),
    p("gpusched.io", "queues/status", &["patch"], "queue status"),
    p(
        "gpusched.io",
        "podgroups/status",
        &["patch"],
        "pod group status",
    ),
    p(
        "scheduling.x-k8s.io",
        "podgroups",
        WATCH,
        "watch: scheduler-plugins pod groups",
    ),
    p(
        "scheduling.k8s.io",
        "podgroups",
        WATCH,
        "watch: upstream Workload API pod groups (workloads; when served)",
    ),
    p(
        "ray.io",
        "rayclusters",
        WATCH,
        "watch: KubeRay RayClusters, each a gang (workloads)",
    ),
    p(
        "kubeflow.org",
        "pytorchjobs",
        WATCH,
        "watch: Kubeflow PyTorchJobs, each a gang (workloads)",
    ),
    p(
        "kubeflow.org",
        "tfjobs",
        WATCH,
        "watch: Kubeflow TFJobs, each a gang (workloads)",
    ),
    p(
        "kubeflow.org",
        "mpijobs",
        WATCH,
        "watch: MPI Operator MPIJobs, each a gang (workloads)",
    ),
    p(
        "jobset.x-k8s.io",
        "jobsets",
        WATCH,
        "watch: JobSets, whose pods are gangs (workloads)",
    ),
    p(
        "leaderworkerset.x-k8s.io",
        "leaderworkersets",
        WATCH,
        "watch: LeaderWorkerSets, each group a gang (workloads)",
    ),
    p(
        "resource.k8s.io",
        "resourceclaims",
        WATCH,
        "watch: DRA ResourceClaims (when served)",
    ),
    p(
        "resource.k8s.io",
        "resourceslices",
        WATCH,
        "watch: DRA ResourceSlices, the devices (when served)",
    ),
    p(
        "resource.k8s.io",
        "deviceclasses",
        WATCH,
        "watch: DRA DeviceClasses (when served)",
    ),
    p(
        "resource.k8s.io",
        "devicetaintrules",
        WATCH,
        "watch: DRA DeviceTaintRules, taints on devices (when served)",
    ),
    p(
        "resource.k8s.io",
        "resourceclaims",
        &["get", "update", "create", "delete"],
        "exec: a claim's finalizer before allocating it, and its removal on rollback; KEP-5004 special claims made for a pod's extended resources, deleted on rollback (dra)",
    ),
    p(
        "resource.k8s.io",
        "resourceclaims/status",
        &["update"],
        "exec: a claim's allocation and reservedFor before the Binding (dra)",
    ),
    p(
        "resource.k8s.io",
        "resourceclaims/binding",
        &["update"],
        "exec: the API server (1.37) also requires it to change a claim's allocation or reservedFor (dra)",
    ),
    p(
        "autoscaling.x-k8s.io",
        "provisioningrequests",
        WATCH,
        "provreq: the ProvisioningRequests gpusched wrote for gangs (--provisioning-requests; when served)",
    ),
    p(
        "autoscaling.x-k8s.io",
        "provisioningrequests",
        &["create", "delete"],
        "provreq: one ProvisioningRequest per capacity-blocked gang; deleted when the gang runs, goes or is held",
    ),
    p(
        "",
        "podtemplates",
        &["create", "delete"],
        "provreq: the PodTemplates a ProvisioningRequest names (one per member shape)",
    ),
    p(
        "",
        "pods",
        &["get", "patch"],
        "provreq: the members' specs for the PodTemplates, and the consume-provisioning-request annotation on them",
    ),
    p(
        "gpusched.io",
        "podgroups",
        &["get"],
        "provreq: the PodGroup that owns a gang's ProvisioningRequest",
    ),
    p(
        "authentication.k8s.io",
        "tokenreviews",
        &["create"],
        "debug: --http-auth=delegated (who is calling)",
    ),
    p(
        "authorization.k8s.io",
        "subjectaccessreviews",
        &["create"],
        "debug: --http-auth=delegated (may they get the URL)",
    ),
];

/// Permissions in the lease's namespace (its Role).
pub const LEASE: &[Permission] = &[p(
    "coordination.k8s.io",
    "leases",
    &["get", "list", "watch", "create", "patch"],
    "controller: leader election (kube-lease-manager gets, creates and patches; the loop watches for a released lease)",
)];

/// The permission a failed request of `verb` on `group`/`resource` needed,
/// as a user would grant it (for messages).
pub fn describe(group: &str, resource: &str, verb: &str) -> String {
    if group.is_empty() {
        format!("{verb} {resource}")
    } else {
        format!("{verb} {resource}.{group}")
    }
}

/// `(group, resource, verb)` triples of a list of permissions, sorted.
pub fn triples(perms: &[Permission]) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = perms
        .iter()
        .flat_map(|p| {
            p.verbs
                .iter()
                .map(|v| (p.group.to_string(), p.resource.to_string(), v.to_string()))
        })
        .collect();
    v.sort();
    v.dedup();
    v
}
