//! What a request for a time-sliced resource means to the scheduler
//! (`docs/scheduling.md`, *One measure for GPUs*).
//!
//! Node agents publish their time-sliced resources
//! (`gpusched.io/sharing`, [`NodeSharing`]). A pod asking `k` replicas of
//! a resource time-sliced `N` ways is placed as one share of
//! `k · ⌊1000 / N⌋` milli-GPU of one GPU ([`replica_milli`]): its `k`
//! replicas come from that GPU, so it needs `k ≤ N`. Quotas, fair share,
//! metrics, `explain` and the decision then count that share like any
//! other, and a node is filled to exactly what it advertises.
//!
//! The resolution is made here, at the boundary, so that a pod means one
//! thing for the whole cluster: the core's pods carry one GPU request,
//! not one per node. That needs one replica count per resource name:
//!
//! * a renamed resource (`nvidia.com/gpu.shared`) listed by nodes with
//!   different counts is a conflict, and pods asking it are told so;
//! * `nvidia.com/gpu` time-sliced under its own name means replicas when
//!   every node with GPUs time-slices it with one count; where other nodes
//!   offer whole GPUs, a pod asking `nvidia.com/gpu` asks whole GPUs, and
//!   the time-sliced nodes are withheld (their GPUs are not offered, with
//!   a warning saying to rename the resource).
//!
//! MIG instances are resolved the same way. Agents publish their MIG
//! layout (`NodeSharing::mig`); a resource name served by MIG instances
//! (`nvidia.com/mig-<profile>` under `migStrategy: mixed`,
//! `nvidia.com/gpu` under `single`) means instances of one profile with
//! one measure (`⌊1000 · g / G⌋`). A pod asking `k` of them gets
//! [`Pod::mig`] (the core places it by instances, `k` free instances of
//! that profile on one GPU) and the share they measure as `pod.gpu` (what
//! quotas, fair share and metrics count). `nvidia.com/gpu` means MIG
//! instances only where every node with GPUs serves it with MIG instances
//! of one profile; where other nodes offer whole GPUs, the `single` nodes
//! are withheld with a warning, as time-sliced ones are.

use gpusched_model::labels::RESOURCE_GPU;
use gpusched_model::sharing::{NodeSharing, replica_milli};
use gpusched_model::{GpuRequest, MigAsk, Pod};
use std::collections::{BTreeMap, BTreeSet};

/// What a time-sliced resource name means in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Meaning {
    /// Replicas of one GPU shared this many ways on every node listing it.
    Replicas(u32),
    /// Nodes disagree; pods asking it are refused with this text.
    Conflict(String),
}

/// What a resource name served by MIG instances means in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigMeaning {
    /// Instances of this profile, each this many milli-GPU, on every node
    /// serving it.
    Instances {
        /// The profile.
        profile: String,
        /// One instance's measure.
        milli: u32,
    },
    /// Nodes disagree; pods asking it are refused with this text.
    Conflict(String),
}

/// The cluster's time-sliced resources, from the nodes' agents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharingTable {
    /// Meaning of each time-sliced resource name.
    pub resources: BTreeMap<String, Meaning>,
    /// Meaning of each resource name served by MIG instances.
    pub mig: BTreeMap<String, MigMeaning>,
    /// Nodes (by position in the input) whose GPUs are withheld: they
    /// time-slice `nvidia.com/gpu` under its own name while other nodes
    /// offer it whole.
    pub withheld: BTreeSet<usize>,
    /// `(node position, warning)`.
    pub warnings: Vec<(usize, String)>,
}

/// One node as the table needs it: its name, its published sharing, and
/// whether it has GPUs.
pub struct NodeIn<'a> {
    /// Node name.
    pub name: &'a str,
    /// Its `gpusched.io/sharing`, if published and readable.
    pub sharing: Option<&'a NodeSharing>,
    /// Whether it has GPUs at all.
    pub has_gpus: bool,
}

/// Builds the table from the nodes, in a fixed order (node names sorted
/// by the caller's order, resources by name).
pub fn table(nodes: &[NodeIn<'_>]) -> SharingTable {
    let mut t = SharingTable::default();
    // resource → replicas → node names
    let mut seen: BTreeMap<&str, BTreeMap<u32, Vec<&str>>> = BTreeMap::new();
    for n in nodes {
        for ts in n.sharing.iter().flat_map(|s| &s.time_slicing) {
            if ts.of != RESOURCE_GPU {
                continue;
            }
            seen.entry(ts.resource.as_str())
                .or_default()
                .entry(ts.replicas)
                .or_default()
                .push(n.name);
        }
    }
    for (res, counts) in &seen {
        let meaning = if counts.len() == 1 {
            Meaning::Replicas(*counts.keys().next().unwrap_or(&1))
        } else {
            let list: Vec<String> = counts
                .iter()
                .map(|(n, nodes)| format!("{n} on {}", nodes.join(", ")))
                .collect();
            Meaning::Conflict(format!(
                "nodes time-slice {res} with different replica counts ({}); gpusched needs one count per resource name (give each count its own name with the agent's sharing.timeSlicing.resources[].rename)",
                list.join("; ")
            ))
        };
        if *res == RESOURCE_GPU {
            let sliced: BTreeSet<usize> = nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| {
                    n.sharing
                        .is_some_and(|s| s.replicas_of(RESOURCE_GPU).is_some())
                })
                .map(|(i, _)| i)
                .collect();
            let whole: Vec<&str> = nodes
                .iter()
                .enumerate()
                .filter(|(i, n)| n.has_gpus && !sliced.contains(i))
                .map(|(_, n)| n.name)
                .collect();
            if !whole.is_empty() {
                for &i in &sliced {
                    t.withheld.insert(i);
                    t.warnings.push((
                        i,
                        format!(
                            "node {} time-slices {RESOURCE_GPU} under its own name while other nodes ({}) offer it as whole GPUs; a pod asking {RESOURCE_GPU} cannot mean both, so gpusched places no GPU pod on this node: rename the resource (the agent's sharing.timeSlicing.renameByDefault)",
                            nodes[i].name,
                            whole.join(", ")
                        ),
                    ));
                }
                continue;
            }
        }
        t.resources.insert(res.to_string(), meaning);
    }
    mig_table(nodes, &mut t);
    t
}

/// Adds the MIG resources to `t`.
fn mig_table(nodes: &[NodeIn<'_>], t: &mut SharingTable) {
    // resource → (profile, milli) → node names
    type Seen<'a> = BTreeMap<&'a str, BTreeMap<(&'a str, u32), Vec<&'a str>>>;
    let mut seen: Seen<'_> = BTreeMap::new();
    for n in nodes {
        for m in n
            .sharing
            .iter()
            .flat_map(|s| &s.mig)
            .flat_map(|g| &g.instances)
        {
            let names = seen
                .entry(m.resource.as_str())
                .or_default()
                .entry((m.profile.as_str(), m.milli()))
                .or_default();
            if names.last() != Some(&n.name) {
                names.push(n.name);
            }
        }
    }
    for (res, kinds) in &seen {
        let meaning = match kinds.iter().next() {
            Some(((profile, milli), _)) if kinds.len() == 1 => MigMeaning::Instances {
                profile: profile.to_string(),
                milli: *milli,
            },
            _ => {
                let list: Vec<String> = kinds
                    .iter()
                    .map(|((p, m), nodes)| format!("{p} ({m} milli) on {}", nodes.join(", ")))
                    .collect();
                MigMeaning::Conflict(format!(
                    "nodes serve {res} with MIG instances of different profiles ({}); gpusched needs one profile per resource name (migStrategy: mixed names each profile)",
                    list.join("; ")
                ))
            }
        };
        if *res == RESOURCE_GPU {
            let single = |n: &NodeIn<'_>| {
                n.sharing.is_some_and(|s| {
                    s.mig
                        .iter()
                        .flat_map(|g| &g.instances)
                        .any(|m| m.resource == RESOURCE_GPU)
                })
            };
            let whole: Vec<&str> = nodes
                .iter()
                .filter(|n| n.has_gpus && !single(n))
                .map(|n| n.name)
                .collect();
            if !whole.is_empty() {
                for (i, n) in nodes.iter().enumerate().filter(|(_, n)| single(n)) {
                    t.withheld.insert(i);
                    t.warnings.push((
                        i,
                        format!(
                            "node {} serves {RESOURCE_GPU} as MIG instances (migStrategy: single) while other nodes ({}) offer it as whole GPUs; a pod asking {RESOURCE_GPU} cannot mean both, so gpusched places no GPU pod on this node: use migStrategy: mixed",
                            n.name,
                            whole.join(", ")
                        ),
                    ));
                }
                continue;
            }
        }
        t.mig.insert(res.to_string(), meaning);
    }
}

/// The one resource of `table` the pod asks for, with its count and
/// meaning (`nvidia.com/gpu` counts the pod's whole GPUs); `None` when it
/// asks none. A pod asking one of them beside other GPUs, or two of them,
/// is refused naming both (`what`, `one_kind` and `one_resource` word the
/// errors).
fn the_one_asked<'t, M>(
    pod: &Pod,
    table: &'t BTreeMap<String, M>,
    what: &str,
    one_kind: &str,
    one_resource: &str,
) -> Result<Option<(&'t String, u64, &'t M)>, String> {
    let mut found: Option<(&String, u64, &M)> = None;
    for (res, meaning) in table {
        let k = if res == RESOURCE_GPU {
            u64::from(pod.gpu.whole())
        } else {
            pod.requests.ext_get(res)
        };
        if k == 0 {
            continue;
        }
        if res != RESOURCE_GPU && !pod.gpu.is_none() {
            return Err(format!(
                "asks {res} ({what}) together with other GPUs; a pod's GPUs are {one_kind}"
            ));
        }
        if let Some((other, _, _)) = &found {
            return Err(format!("asks both {other} and {res}; {one_resource}"));
        }
        found = Some((res, k, meaning));
    }
    Ok(found)
}

/// Turns a pod's ask of MIG instances into [`Pod::mig`] and the share
/// they measure (`pod.gpu`); `Ok(false)` when it asks none. Errors name
/// the resource and why.
pub fn resolve_mig(pod: &mut Pod, t: &SharingTable) -> Result<bool, String> {
    let found = the_one_asked(
        pod,
        &t.mig,
        "MIG instances",
        "MIG instances of one profile or GPUs of one kind",
        "a pod's MIG instances are of one profile",
    )?;
    let Some((resource, k, meaning)) = found else {
        return Ok(false);
    };
    let (profile, milli) = match meaning {
        MigMeaning::Instances { profile, milli } => (profile, *milli),
        MigMeaning::Conflict(why) => return Err(why.clone()),
    };
    if k > gpusched_model::sharing::MAX_MIG_INSTANCES as u64 {
        return Err(format!(
            "asks {k} MIG instances of {resource}; a pod's instances come from one GPU"
        ));
    }
    let count = k as u32;
    pod.mig = Some(Box::new(MigAsk {
        resource: resource.clone(),
        profile: profile.clone(),
        count,
    }));
    pod.gpu = GpuRequest::Share {
        milli: count * milli,
        memory_mib: 0,
    };
    Ok(true)
}

/// A pod's ask of a time-sliced resource, once resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaAsk {
    /// The resource asked.
    pub resource: String,
    /// Replicas asked.
    pub replicas: u32,
}

/// Turns a pod's ask of time-sliced replicas into the share it is placed
/// as (`pod.gpu`); `Ok(None)` when it asks none. Errors name the resource
/// and why.
pub fn resolve(pod: &mut Pod, t: &SharingTable) -> Result<Option<ReplicaAsk>, String> {
    if resolve_mig(pod, t)? {
        return Ok(None);
    }
    let found = the_one_asked(
        pod,
        &t.resources,
        "time-sliced replicas",
        "replicas of one GPU or GPUs of one kind",
        "a pod's time-sliced replicas come from one resource",
    )?;
    let Some((resource, k, meaning)) = found else {
        return Ok(None);
    };
    let n = match meaning {
        Meaning::Replicas(n) => *n,
        Meaning::Conflict(why) => return Err(why.clone()),
    };
    if k > u64::from(n) {
        return Err(format!(
            "asks {k} replicas of {resource}; a pod's replicas come from one GPU, which is time-sliced {n} ways"
        ));
    }
    let replicas = k as u32;
    pod.gpu = GpuRequest::Share {
        milli: replicas * replica_milli(n),
        memory_mib: 0,
    };
    Ok(Some(ReplicaAsk {
        resource: resource.clone(),
        replicas,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::sharing::{SHARING_VERSION, TimeSliced};

    fn sh(list: &[(&str, u32)]) -> NodeSharing {
        NodeSharing {
            v: SHARING_VERSION,
            time_slicing: list
                .iter()
                .map(|(r, n)| TimeSliced {
                    resource: r.to_string(),
                    of: RESOURCE_GPU.into(),
                    replicas: *n,
                })
                .collect(),
            mig: Vec::new(),
        }
    }

    fn pod_asking(res: &str, k: u64) -> Pod {
        let mut p = Pod::new("ml/p", "default");
        if res == RESOURCE_GPU {
            p.gpu = GpuRequest::Whole(k as u32);
        } else {
            p.requests.ext.insert(res.into(), k);
        }
        p
    }

    #[test]
    fn replicas_become_shares_of_one_gpu() {
        let a = sh(&[("nvidia.com/gpu.shared", 4)]);
        let t = table(&[
            NodeIn {
                name: "a",
                sharing: Some(&a),
                has_gpus: true,
            },
            NodeIn {
                name: "b",
                sharing: None,
                has_gpus: true,
            },
        ]);
        assert!(t.withheld.is_empty());
        let mut p = pod_asking("nvidia.com/gpu.shared", 3);
        let ask = resolve(&mut p, &t).unwrap().unwrap();
        assert_eq!(ask.replicas, 3);
        assert_eq!(
            p.gpu,
            GpuRequest::Share {
                milli: 750,
                memory_mib: 0
            }
        );
        // the kubelet's count is still checked per node
        assert_eq!(p.requests.ext_get("nvidia.com/gpu.shared"), 3);
        // whole GPUs are whole GPUs: b offers them, a renamed its replicas
        let mut w = pod_asking(RESOURCE_GPU, 2);
        assert_eq!(resolve(&mut w, &t), Ok(None));
        assert_eq!(w.gpu, GpuRequest::Whole(2));
        let e = resolve(&mut pod_asking("nvidia.com/gpu.shared", 5), &t).unwrap_err();
        assert!(e.contains("asks 5 replicas") && e.contains("4 ways"), "{e}");
        let mut both = pod_asking("nvidia.com/gpu.shared", 1);
        both.gpu = GpuRequest::Share {
            milli: 300,
            memory_mib: 0,
        };
        assert!(
            resolve(&mut both, &t)
                .unwrap_err()
                .contains("together with")
        );
    }

    #[test]
    fn own_name_means_replicas_only_where_every_gpu_node_agrees() {
        let a = sh(&[(RESOURCE_GPU, 4)]);
        let b = sh(&[(RESOURCE_GPU, 4)]);
        let node = |name, s, has_gpus| NodeIn {
            name,
            sharing: s,
            has_gpus,
        };
        // every GPU node time-slices 4 ways (a CPU node does not count)
        let t = table(&[
            node("a", Some(&a), true),
            node("b", Some(&b), true),
            node("cpu", None, false),
        ]);
        let mut p = pod_asking(RESOURCE_GPU, 1);
        resolve(&mut p, &t).unwrap().unwrap();
        assert_eq!(p.gpu.milli(), 250);
        // a node offering whole GPUs: pods ask whole GPUs, a and b withheld
        let t = table(&[
            node("a", Some(&a), true),
            node("b", Some(&b), true),
            node("c", None, true),
        ]);
        assert_eq!(t.withheld, BTreeSet::from([0, 1]));
        assert!(
            t.warnings[0].1.contains("rename the resource"),
            "{:?}",
            t.warnings
        );
        let mut p = pod_asking(RESOURCE_GPU, 1);
        assert_eq!(resolve(&mut p, &t), Ok(None));
        assert_eq!(p.gpu, GpuRequest::Whole(1));
        // two counts under one name: refused with both named
        let c = sh(&[(RESOURCE_GPU, 8)]);
        let t = table(&[node("a", Some(&a), true), node("c", Some(&c), true)]);
        let e = resolve(&mut pod_asking(RESOURCE_GPU, 1), &t).unwrap_err();
        assert!(e.contains("4 on a; 8 on c"), "{e}");
        // a pod asking no GPU is untouched
        let mut cpu = Pod::new("ml/cpu", "default");
        assert_eq!(resolve(&mut cpu, &t), Ok(None));
    }

    fn mig(list: &[(&str, &str, u32, u32)]) -> NodeSharing {
        use gpusched_model::sharing::{MigGpu, MigInstance};
        NodeSharing {
            v: SHARING_VERSION,
            time_slicing: Vec::new(),
            mig: vec![MigGpu {
                index: 0,
                instances: list
                    .iter()
                    .enumerate()
                    .map(|(i, (res, profile, g, of))| MigInstance {
                        id: format!("MIG-{i}"),
                        profile: profile.to_string(),
                        slices: *g,
                        of: *of,
                        memory_mib: 0,
                        resource: res.to_string(),
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn mig_resources_become_instance_asks_measured_by_slices() {
        let a = mig(&[
            ("nvidia.com/mig-1g.10gb", "1g.10gb", 1, 7),
            ("nvidia.com/mig-3g.40gb", "3g.40gb", 3, 7),
        ]);
        let node = |name, s| NodeIn {
            name,
            sharing: Some(s),
            has_gpus: true,
        };
        let t = table(&[node("a", &a)]);
        let mut p = pod_asking("nvidia.com/mig-1g.10gb", 3);
        assert_eq!(resolve(&mut p, &t), Ok(None));
        assert_eq!(
            p.mig.as_deref(),
            Some(&MigAsk {
                resource: "nvidia.com/mig-1g.10gb".into(),
                profile: "1g.10gb".into(),
                count: 3
            })
        );
        assert_eq!(p.gpu.milli(), 3 * 142);
        // with other GPUs, or two profiles: refused, naming why
        let mut both = pod_asking("nvidia.com/mig-1g.10gb", 1);
        both.requests.ext.insert("nvidia.com/mig-3g.40gb".into(), 1);
        assert!(resolve(&mut both, &t).unwrap_err().contains("asks both"));
        let mut with = pod_asking("nvidia.com/mig-1g.10gb", 1);
        with.gpu = GpuRequest::Whole(1);
        assert!(
            resolve(&mut with, &t)
                .unwrap_err()
                .contains("together with")
        );
        // one name, two measures (a 1g of 7 and of 4 slices): a conflict
        let b = mig(&[("nvidia.com/mig-1g.10gb", "1g.10gb", 1, 4)]);
        let t = table(&[node("a", &a), node("b", &b)]);
        let e = resolve(&mut pod_asking("nvidia.com/mig-1g.10gb", 1), &t).unwrap_err();
        assert!(
            e.contains("142 milli) on a") && e.contains("250 milli) on b"),
            "{e}"
        );
        // single: nvidia.com/gpu means instances where every GPU node agrees
        let s = mig(&[("nvidia.com/gpu", "1g.10gb", 1, 7)]);
        let t = table(&[node("s", &s)]);
        let mut p = pod_asking(RESOURCE_GPU, 2);
        assert_eq!(resolve(&mut p, &t), Ok(None));
        assert_eq!(p.mig.as_ref().map(|m| m.count), Some(2));
        assert_eq!(p.gpu.milli(), 284);
        let t = table(&[
            node("s", &s),
            NodeIn {
                name: "w",
                sharing: None,
                has_gpus: true,
            },
        ]);
        assert_eq!(t.withheld, BTreeSet::from([0]));
        let mut p = pod_asking(RESOURCE_GPU, 1);
        assert_eq!(resolve(&mut p, &t), Ok(None));
        assert_eq!((p.gpu, p.mig), (GpuRequest::Whole(1), None));
    }
}
