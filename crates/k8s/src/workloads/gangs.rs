//! The gang of each workload object: its name, size and queue, or why the
//! object cannot give one.

use super::*;

/// A JobSet's gang. All its replicated jobs' pods form one gang of
/// Σ replicas × pods per Job (pods per Job: `parallelism`, default 1, at
/// most `completions`), one per restart attempt. When the replicated jobs
/// start one after another (`startupPolicyOrder: InOrder`, or `dependsOn`),
/// a later one's pods do not exist until an earlier one runs, so each
/// replicated job is its own gang.
pub fn jobset(js: &JobSet) -> Result<Workload, String> {
    let obj = object_name("jobset", &js.metadata);
    let queue = meta_queue(&js.metadata);
    if !gang_wanted(&js.metadata, &obj)? {
        return Ok(Workload {
            kind: WorkloadKind::JobSet,
            queue,
            gang: Gang::Off("opted out (gpusched.io/gang: \"false\")"),
        });
    }
    let mut per: BTreeMap<String, u32> = BTreeMap::new();
    let mut total: u32 = 0;
    for (i, r) in js.spec.replicated_jobs.iter().enumerate() {
        let field = format!("spec.replicatedJobs[{i}]");
        let replicas = r.replicas.unwrap_or(1);
        let sizes = r.template.spec.clone().unwrap_or_default();
        let parallelism = sizes.parallelism.unwrap_or(1);
        let per_job = match sizes.completions {
            Some(c) => parallelism.min(c),
            None => parallelism,
        };
        for (what, v) in [
            ("replicas", replicas),
            ("template.spec.parallelism", parallelism),
            ("template.spec.completions", sizes.completions.unwrap_or(0)),
        ] {
            if v < 0 {
                return Err(format!(
                    "{obj}: {field}.{what}: must not be negative, is {v}"
                ));
            }
        }
        let n = u32::try_from(replicas.saturating_mul(per_job))
            .ok()
            .filter(|n| total.checked_add(*n).is_some())
            .ok_or_else(|| {
                format!("{obj}: {field}: {replicas} replicas × {per_job} pods is more pods than one gang can hold")
            })?;
        total += n;
        per.insert(r.name.clone(), n);
    }
    let staged = js
        .spec
        .startup_policy
        .as_ref()
        .and_then(|s| s.startup_policy_order.as_deref())
        == Some("InOrder")
        || js
            .spec
            .replicated_jobs
            .iter()
            .any(|r| r.depends_on.as_ref().is_some_and(|d| !d.is_empty()));
    let gang = if total == 0 {
        Gang::Off("no pods")
    } else if staged {
        Gang::PerReplicatedJob { min_member: per }
    } else {
        Gang::Whole { min_member: total }
    };
    Ok(Workload {
        kind: WorkloadKind::JobSet,
        queue,
        gang,
    })
}

/// A LeaderWorkerSet's gangs: each group (leader + workers, `size` pods)
/// is one gang; replicas are independent gangs. With `startupPolicy:
/// LeaderReady` the workers are made only once the leader runs, so a gang
/// could never complete: such a set is placed pod by pod.
pub fn leader_worker_set(l: &LeaderWorkerSet) -> Result<Workload, String> {
    let obj = object_name("leaderworkerset", &l.metadata);
    let queue = meta_queue(&l.metadata);
    let off = |why| {
        Ok(Workload {
            kind: WorkloadKind::LeaderWorkerSet,
            queue: queue.clone(),
            gang: Gang::Off(why),
        })
    };
    if !gang_wanted(&l.metadata, &obj)? {
        return off("opted out (gpusched.io/gang: \"false\")");
    }
    if l.spec.startup_policy.as_deref() == Some("LeaderReady") {
        return off("startupPolicy LeaderReady: workers are made after the leader runs");
    }
    let size = l.spec.leader_worker_template.size.unwrap_or(1);
    let size = u32::try_from(size)
        .ok()
        .filter(|s| *s >= 1)
        .ok_or_else(|| {
            format!("{obj}: spec.leaderWorkerTemplate.size: must be 1 or more, is {size}")
        })?;
    Ok(Workload {
        kind: WorkloadKind::LeaderWorkerSet,
        queue,
        gang: Gang::Whole { min_member: size },
    })
}

/// An upstream PodGroup (`scheduling.k8s.io/v1beta1`): a gang of
/// `spec.schedulingPolicy.gang.minCount` pods; the `basic` policy places
/// its pods one by one, as kube-scheduler does.
pub fn upstream_pod_group(
    g: &k8s_openapi::api::scheduling::v1beta1::PodGroup,
) -> Result<Workload, String> {
    let obj = object_name("podgroup.scheduling.k8s.io", &g.metadata);
    let queue = meta_queue(&g.metadata);
    let gang = match &g.spec.scheduling_policy.gang {
        Some(gang) => {
            let min = u32::try_from(gang.min_count)
                .ok()
                .filter(|m| *m >= 1)
                .ok_or_else(|| {
                    format!(
                        "{obj}: spec.schedulingPolicy.gang.minCount: must be 1 or more, is {}",
                        gang.min_count
                    )
                })?;
            if gang_wanted(&g.metadata, &obj)? {
                Gang::Whole { min_member: min }
            } else {
                Gang::Off("opted out (gpusched.io/gang: \"false\")")
            }
        }
        None => Gang::Off("basic scheduling policy"),
    };
    Ok(Workload {
        kind: WorkloadKind::PodGroup,
        queue,
        gang,
    })
}

/// A RayCluster's gang: the head and its workers, sized as KubeRay sizes
/// the gang it asks batch schedulers for: 1 + Σ over worker groups of
/// replicas × `numOfHosts`, replicas being `minReplicas` when the Ray
/// autoscaler runs (it adds the rest later, one by one), else the desired
/// `replicas` held within `minReplicas..maxReplicas`; suspended groups
/// count 0. A RayJob's or RayService's pods belong to the RayCluster it
/// makes (the submitter Job's pods to none).
pub fn ray_cluster(r: &RayCluster) -> Result<Workload, String> {
    let obj = object_name("raycluster", &r.metadata);
    let queue = meta_queue(&r.metadata);
    if !gang_wanted(&r.metadata, &obj)? {
        return Ok(Workload {
            kind: WorkloadKind::RayCluster,
            queue,
            gang: Gang::Off("opted out (gpusched.io/gang: \"false\")"),
        });
    }
    if r.spec.suspend == Some(true) {
        return Ok(Workload {
            kind: WorkloadKind::RayCluster,
            queue,
            gang: Gang::Off("no pods"),
        });
    }
    let autoscaling = r.spec.enable_in_tree_autoscaling == Some(true);
    let mut total: i64 = 1;
    for (i, g) in r.spec.worker_group_specs.iter().enumerate() {
        let field = format!("spec.workerGroupSpecs[{i}]");
        if g.suspend == Some(true) {
            continue;
        }
        let min = g.min_replicas.unwrap_or(0);
        let max = g.max_replicas.unwrap_or(i64::from(i32::MAX));
        let hosts = g.num_of_hosts.unwrap_or(1);
        for (what, v) in [
            ("minReplicas", min),
            ("maxReplicas", max),
            ("numOfHosts", hosts),
        ] {
            if v < 0 {
                return Err(format!(
                    "{obj}: {field}.{what}: must not be negative, is {v}"
                ));
            }
        }
        let replicas = if autoscaling {
            min
        } else {
            g.replicas.unwrap_or(min).max(min).min(max)
        };
        total = total.saturating_add(replicas.saturating_mul(hosts));
    }
    let min_member = u32::try_from(total)
        .map_err(|_| format!("{obj}: {total} pods is more than one gang can hold"))?;
    Ok(Workload {
        kind: WorkloadKind::RayCluster,
        queue,
        gang: Gang::Whole { min_member },
    })
}

/// A Kubeflow job's gang, as its operator sizes the gang it asks batch
/// schedulers for: `runPolicy.schedulingPolicy.minAvailable` when set,
/// else every replica of every replica type (training-operator: Σ
/// `replicas`, default 1; MPI Operator: the workers plus the launcher).
/// An MPI Operator job with `launcherCreationPolicy: WaitForWorkersReady`
/// makes its launcher only once the workers run, so its gang is the
/// workers alone.
pub fn kubeflow_job(
    kind: WorkloadKind,
    meta: &ObjectMeta,
    spec: &KubeflowJobSpec,
) -> Result<Workload, String> {
    let obj = object_name(&kind.api_kind().to_lowercase(), meta);
    let queue = meta_queue(meta);
    let done = |gang| {
        Ok(Workload {
            kind,
            queue: queue.clone(),
            gang,
        })
    };
    if !gang_wanted(meta, &obj)? {
        return done(Gang::Off("opted out (gpusched.io/gang: \"false\")"));
    }
    // The training-operator's v1 MPIJob sizes its replicas as the MPI
    // Operator does (workers default to 0) and makes its launcher with its
    // workers, in the same pass: the `AtStartup` shape.
    let mpi = matches!(kind, WorkloadKind::MpiJob | WorkloadKind::MpiJobV1);
    let wait_for_workers = kind == WorkloadKind::MpiJob
        && spec.launcher_creation_policy.as_deref() == Some("WaitForWorkersReady");
    let min_available = spec
        .run_policy
        .as_ref()
        .and_then(|r| r.scheduling_policy.as_ref())
        .and_then(|s| s.min_available);
    let total: i64 = match min_available {
        Some(m) if !wait_for_workers => m,
        _ => {
            let mut total: i64 = 0;
            for (field, v) in &spec.rest {
                if !field.ends_with("ReplicaSpecs") {
                    continue;
                }
                let Some(types) = v.as_object() else {
                    return Err(format!("{obj}: spec.{field}: not a map of replica types"));
                };
                for (rtype, r) in types {
                    let launcher = rtype.eq_ignore_ascii_case("launcher");
                    if launcher && wait_for_workers {
                        continue;
                    }
                    let default = if mpi && !launcher { 0 } else { 1 };
                    let n = match r.get("replicas") {
                        None | Some(serde_json::Value::Null) => default,
                        Some(v) => v.as_i64().ok_or_else(|| {
                            format!("{obj}: spec.{field}.{rtype}.replicas: not an integer")
                        })?,
                    };
                    if n < 0 {
                        return Err(format!(
                            "{obj}: spec.{field}.{rtype}.replicas: must not be negative, is {n}"
                        ));
                    }
                    total = total.saturating_add(n);
                }
            }
            total
        }
    };
    if total < 0 {
        return Err(format!(
            "{obj}: spec.runPolicy.schedulingPolicy.minAvailable: must not be negative, is {total}"
        ));
    }
    match u32::try_from(total) {
        Ok(0) => done(Gang::Off("no pods")),
        Ok(min_member) => done(Gang::Whole { min_member }),
        Err(_) => Err(format!(
            "{obj}: {total} pods is more than one gang can hold"
        )),
    }
}
