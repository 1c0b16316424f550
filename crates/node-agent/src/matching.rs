//! Which scheduler decision a kubelet call is for (`docs/protocol.md`,
//! *Allocate* and *GetPreferredAllocation*): whole GPUs, shares,
//! time-sliced replicas and MIG devices matched to the decision of exactly
//! their size, and the answers built from it. Beside [`crate::plan`] (the
//! answers without decisions); [`crate::server`] is the gRPC adapter that
//! calls both.

use crate::agent::Agent;
use crate::api;
use crate::decisions::Miss;
use tonic::Status;

/// `Allocate` honouring the scheduler's decisions (`docs/protocol.md`)
/// when the agent runs with `--node-name` and decisions govern the
/// resource; `Ok(None)`: they do not, serve the call as asked.
pub async fn allocate(
    agent: &Agent,
    res: usize,
    req: &api::AllocateRequest,
) -> Result<Option<api::AllocateResponse>, Status> {
    let plan = &agent.plans[res];
    let coord = match agent.coord.get() {
        Some(c)
            if plan.is_whole_gpu()
                || plan.is_share()
                || plan.is_time_sliced_gpu()
                || plan.is_mig() =>
        {
            c.clone()
        }
        _ if plan.is_share() => {
            return Err(Status::failed_precondition(format!(
                "allocate: {} needs the scheduler's decisions; run the agent with --node-name",
                plan.name
            )));
        }
        _ => return Ok(None),
    };
    if req.container_requests.is_empty() {
        return Err(Status::invalid_argument("allocate: no container requests"));
    }
    let _serial = coord.serial.lock().await;
    let view = agent.view(res);
    let healthy = agent.gpu_healthy();
    let s = &agent.settings;
    let inv = &agent.inventory;
    let mut out = api::AllocateResponse::default();
    for c in &req.container_requests {
        // Unknown, duplicated and unhealthy ids are refused first.
        let r = plan
            .allocate(&c.devices_ids, &view.unit_healthy, s, inv)
            .map_err(|e| e.into_status())?;
        let units: Vec<usize> = c
            .devices_ids
            .iter()
            .filter_map(|id| plan.by_id.get(id).map(|&d| plan.devices[d].unit))
            .collect();
        let node = &coord.side.node;
        if plan.is_whole_gpu() {
            let gpus: Vec<usize> = units.iter().map(|&u| plan.units[u].gpu).collect();
            match coord.allocate_whole(&gpus, &healthy).await {
                Ok(m) => {
                    // The kubelet does not say which pod calls: the log
                    // names the decision charged (PodResources later
                    // tells which pod holds the GPUs).
                    tracing::info!(resource = %plan.name, decision_of = %m.decision, ids = ?c.devices_ids, "allocate: charged to the decision of pod {} (or another pending pod of the same size)", m.decision);
                    if let Some(n) = &m.note {
                        tracing::warn!(resource = %plan.name, "allocate: the kubelet did not take the charged decision's GPUs: {n}");
                    }
                    for &g in &gpus {
                        agent.mark_allocated(g);
                    }
                    out.container_responses.push(r);
                }
                Err(Miss::NoDecision(m)) if !coord.side.require_decision => {
                    tracing::info!(resource = %plan.name, "allocate: {m}; served as asked (--require-decision=false)");
                    out.container_responses.push(r);
                }
                Err(m) => {
                    let msg = format!("allocate {} on node {node}: {m}", plan.name);
                    coord.report_allocate_refusal(gpus.len(), false, &msg);
                    return Err(Status::failed_precondition(msg));
                }
            }
        } else {
            // gpu-milli tokens, time-sliced replicas (k of a GPU
            // shared N ways = k·⌊1000/N⌋ milli: gpusched_model::sharing),
            // or MIG devices (k of g of G slices = k·⌊1000·g/G⌋)
            let (n, resource) = plan.share_call(c.devices_ids.len());
            let first = units.first().map(|&u| plan.units[u].gpu);
            let hint = first.filter(|&g| units.iter().all(|&u| plan.units[u].gpu == g));
            match coord.allocate_share(n, resource, hint, &healthy).await {
                Ok(g) => {
                    tracing::info!(resource = %plan.name, decision_of = %g.pod, gpu = g.gpu, milli = n, "allocate: share charged to the decision of pod {} (or another pending pod of the same size)", g.pod);
                    if plan.is_mig() {
                        // the answer is the decided instances, whatever
                        // ids the kubelet passed (it was steered to them)
                        let r = plan
                            .allocate(&g.mig, &view.unit_healthy, s, inv)
                            .map_err(|e| {
                                Status::failed_precondition(format!(
                                    "allocate {} on node {node}: the decided MIG instances {:?} of pod {}: {}",
                                    plan.name,
                                    g.mig,
                                    g.pod,
                                    e.into_status().message()
                                ))
                            })?;
                        if let Ok(mut told) = agent.mig_told.lock() {
                            for (id, m) in c.devices_ids.iter().zip(&g.mig) {
                                told.insert(id.clone(), m.clone());
                            }
                        }
                        agent.mark_allocated(g.gpu);
                        out.container_responses.push(r);
                        continue;
                    }
                    let Some(u) = plan.units.iter().position(|x| x.gpu == g.gpu) else {
                        return Err(Status::internal("share GPU not in plan"));
                    };
                    // the answer names the decided GPU, whatever the
                    // ids' prefix (they are counters)
                    let Some(token) = plan.devices.iter().find(|d| d.unit == u) else {
                        return Err(Status::internal("share GPU has no device"));
                    };
                    let mut r = plan
                        .allocate(std::slice::from_ref(&token.id), &view.unit_healthy, s, inv)
                        .map_err(|e| e.into_status())?;
                    if resource.is_none() {
                        share_env(&mut r, &plan.units[u].uuid, n, g.memory_mib);
                    } else {
                        r.envs
                            .insert("GPUSCHED_GPU_UUID".into(), plan.units[u].uuid.clone());
                        if let Ok(mut told) = agent.replica_told.lock() {
                            for id in &c.devices_ids {
                                told.insert(id.clone(), g.gpu);
                            }
                        }
                    }
                    agent.mark_allocated(g.gpu);
                    out.container_responses.push(r);
                }
                Err(Miss::NoDecision(m)) if resource.is_some() && !coord.side.require_decision => {
                    tracing::info!(resource = %plan.name, "allocate: {m}; served as asked (--require-decision=false)");
                    for &u in &units {
                        agent.mark_allocated(plan.units[u].gpu);
                    }
                    out.container_responses.push(r);
                }
                Err(m) => {
                    let msg = format!("allocate {} on node {node}: {m}", plan.name);
                    coord.report_allocate_refusal(n as usize, true, &msg);
                    return Err(Status::failed_precondition(msg));
                }
            }
        }
    }
    coord.allocated.notify_one();
    Ok(Some(out))
}

/// Steers the kubelet to the first pending decision that fits.
pub fn preferred(
    agent: &Agent,
    res: usize,
    c: &api::ContainerPreferredAllocationRequest,
) -> Option<Vec<String>> {
    let plan = &agent.plans[res];
    let coord = agent.coord.get()?;
    let size = usize::try_from(c.allocation_size).ok().filter(|&n| n > 0)?;
    let gpu_of = |id: &String| {
        plan.by_id
            .get(id)
            .map(|&d| plan.units[plan.devices[d].unit].gpu)
    };
    if plan.is_whole_gpu() {
        let avail: Vec<usize> = c.available_device_i_ds.iter().filter_map(gpu_of).collect();
        let must: Vec<usize> = c
            .must_include_device_i_ds
            .iter()
            .filter_map(gpu_of)
            .collect();
        let pick = coord.ledger().preferred_whole(&avail, &must, size)?;
        let ids: Vec<String> = pick
            .iter()
            .filter_map(|&g| {
                c.available_device_i_ds
                    .iter()
                    .find(|id| gpu_of(id) == Some(g))
                    .cloned()
            })
            .collect();
        (ids.len() == size).then_some(ids)
    } else if plan.is_mig() {
        // the decided instances, if the kubelet offers them all
        let (milli, resource) = plan.share_call(size);
        let ids = coord.ledger().preferred_mig(milli, resource?)?;
        let offered = ids.len() == size
            && ids.iter().all(|id| c.available_device_i_ds.contains(id))
            && c.must_include_device_i_ds.iter().all(|id| ids.contains(id));
        offered.then_some(ids)
    } else if plan.is_share() || plan.is_time_sliced_gpu() {
        let (milli, resource) = plan.share_call(size);
        let g = coord.ledger().preferred_share(milli, resource)?;
        let mut ids: Vec<String> = c.must_include_device_i_ds.clone();
        for id in &c.available_device_i_ds {
            if ids.len() >= size {
                break;
            }
            if gpu_of(id) == Some(g) && !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        (ids.len() == size).then_some(ids)
    } else {
        None
    }
}

/// Whether a preferred-allocation request should take a fresh pod list
/// first: decisions govern the resource, and a container request finds no
/// decision to steer to, or none expecting a call of exactly its size (a
/// kubelet admits a pod as soon as its binding arrives, often before the
/// agent's watch has it; seen on a real kubelet, issue 29).
pub fn preferred_misses(agent: &Agent, res: usize, req: &api::PreferredAllocationRequest) -> bool {
    let plan = &agent.plans[res];
    if !(plan.is_whole_gpu() || plan.is_share() || plan.is_time_sliced_gpu() || plan.is_mig()) {
        return false;
    }
    let Some(coord) = agent.coord.get() else {
        return false;
    };
    let unexpected = |c: &api::ContainerPreferredAllocationRequest| {
        let size = usize::try_from(c.allocation_size).unwrap_or(0);
        let l = coord.ledger();
        if plan.is_whole_gpu() {
            c.must_include_device_i_ds.is_empty() && !l.expects_whole(size)
        } else {
            let (milli, resource) = plan.share_call(size);
            !l.expects_share(milli, resource)
        }
    };
    req.container_requests
        .iter()
        .any(|c| preferred(agent, res, c).is_none() || unexpected(c))
}

/// The environment of a GPU share (`docs/protocol.md`). Hints only: an
/// enforcing layer (HAMi-core, MPS) must read them.
pub fn share_env(r: &mut api::ContainerAllocateResponse, uuid: &str, milli: u32, memory_mib: u64) {
    r.envs
        .insert("NVIDIA_VISIBLE_DEVICES".into(), uuid.to_string());
    r.envs.insert("GPUSCHED_GPU_UUID".into(), uuid.to_string());
    r.envs
        .insert("GPUSCHED_GPU_MILLI".into(), milli.to_string());
    r.envs.insert(
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
        (milli / 10).max(1).to_string(),
    );
    if memory_mib > 0 {
        r.envs.insert(
            "GPUSCHED_GPU_MEMORY_LIMIT_MIB".into(),
            memory_mib.to_string(),
        );
        r.envs.insert(
            "CUDA_DEVICE_MEMORY_LIMIT_0".into(),
            format!("{memory_mib}m"),
        );
    }
}
