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

use gpusched_model::labels::RESOURCE_GPU;
use gpusched_model::sharing::{NodeSharing, replica_milli};
use gpusched_model::{GpuRequest, Pod};
use std::collections::{BTreeMap, BTreeSet};

/// What a time-sliced resource name means in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Meaning {
    /// Replicas of one GPU shared this many ways on every node listing it.
    Replicas(u32),
    /// Nodes disagree; pods asking it are refused with this text.
    Conflict(String),
}

/// The cluster's time-sliced resources, from the nodes' agents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharingTable {
    /// Meaning of each time-sliced resource name.
    pub resources: BTreeMap<String, Meaning>,
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
    t
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
    let mut found: Option<(String, u64, &Meaning)> = None;
    for (res, meaning) in &t.resources {
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
                "asks {res} (time-sliced replicas) together with other GPUs; a pod's GPUs are replicas of one GPU or GPUs of one kind"
            ));
        }
        if let Some((other, _, _)) = &found {
            return Err(format!(
                "asks both {other} and {res}; a pod's time-sliced replicas come from one resource"
            ));
        }
        found = Some((res.clone(), k, meaning));
    }
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
    Ok(Some(ReplicaAsk { resource, replicas }))
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
}
