//! `doctor --probe`: a tiny pod asking one GPU through gpusched runs
//! `nvidia-smi -L`; what it printed (and where it ran, with which GPU the
//! decision named) becomes a finding. The pod is deleted afterwards, also
//! when waiting fails.

use super::{Finding, Status};
use crate::decision::{ANNOTATION_DECISION, GpuDecision};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, LogParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use std::time::{Duration, Instant};

/// What the probe runs.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// Namespace of the probe pod.
    pub namespace: String,
    /// Image with `nvidia-smi` (the NVIDIA container runtime mounts it).
    pub image: String,
    /// How long to wait for it to finish.
    pub timeout: Duration,
}

/// The probe pod's manifest.
pub fn probe_pod(name: &str, image: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpusched-doctor-probe"}},
        "spec": {
            "schedulerName": crate::translate::SCHEDULER_NAME,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "probe", "image": image,
                "command": ["nvidia-smi", "-L"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}
            }]
        }
    })
}

/// Runs the probe; always returns a finding (failures included).
pub async fn run(client: &Client, opts: &ProbeOptions) -> Finding {
    let api: Api<Pod> = Api::namespaced(client.clone(), &opts.namespace);
    let suffix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() % 1_000_000_000)
        .unwrap_or(0);
    let name = format!("gpusched-doctor-probe-{suffix}");
    let subject = format!("pod/{}/{name}", opts.namespace);
    let pod: Pod = match serde_json::from_value(probe_pod(&name, &opts.image)) {
        Ok(p) => p,
        Err(e) => return Finding::new("probe", Status::Fail, subject, e.to_string(), ""),
    };
    if let Err(e) = api.create(&PostParams::default(), &pod).await {
        return Finding::new(
            "probe",
            Status::Fail,
            subject,
            format!("cannot create the probe pod: {e}"),
            "doctor --probe needs permission to create, read logs of and delete pods in the namespace",
        );
    }
    let f = wait(&api, &name, &subject, opts.timeout).await;
    if let Err(e) = api
        .delete(&name, &DeleteParams::default().grace_period(0))
        .await
    {
        tracing::warn!("deleting probe pod {name}: {e}");
    }
    f
}

async fn wait(api: &Api<Pod>, name: &str, subject: &str, timeout: Duration) -> Finding {
    let start = Instant::now();
    loop {
        let p = match api.get(name).await {
            Ok(p) => p,
            Err(e) => {
                return Finding::new("probe", Status::Fail, subject, e.to_string(), "");
            }
        };
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        if phase == "Succeeded" || phase == "Failed" {
            let logs = api
                .logs(name, &LogParams::default())
                .await
                .unwrap_or_else(|e| format!("(logs unavailable: {e})"));
            let decided = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_DECISION))
                .and_then(|t| GpuDecision::parse(t).ok())
                .map(|d| d.gpus.join(","))
                .unwrap_or_default();
            let seen = logs.trim().replace('\n', "; ");
            let agrees = decided.is_empty() || decided.split(',').all(|u| logs.contains(u));
            let ok = phase == "Succeeded" && logs.contains("GPU ") && agrees;
            return Finding::new(
                "probe",
                if ok { Status::Ok } else { Status::Fail },
                subject,
                format!(
                    "{phase} on {}: nvidia-smi -L saw \"{seen}\"; the decision named {}",
                    node.unwrap_or_default(),
                    if decided.is_empty() {
                        "no GPU"
                    } else {
                        &decided
                    }
                ),
                if ok {
                    ""
                } else if !agrees {
                    "the container saw other GPUs than the scheduler decided: check the agent's decisions (docs/protocol.md)"
                } else {
                    "the GPU is not usable in containers: check the NVIDIA container toolkit / runtime class on that node"
                },
            );
        }
        if start.elapsed() > timeout {
            let why = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
                .and_then(|c| c.message.clone())
                .unwrap_or_default();
            return Finding::new(
                "probe",
                Status::Fail,
                subject,
                format!(
                    "still {phase} after {} s{}{}",
                    timeout.as_secs(),
                    node.map(|n| format!(" on {n}")).unwrap_or_default(),
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(": {why}")
                    }
                ),
                "not scheduled: is the gpusched scheduler running? scheduled: is the image pullable and the agent serving Allocate?",
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
