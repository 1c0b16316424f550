//! Jobs labelled as gangs: a PodGroup for each.

use super::*;

/// Watches `batch/v1` Jobs labelled `gpusched.io/gang: "true"` and creates
/// a PodGroup for each (named after the Job, minMember = parallelism, owned
/// by the Job so it goes with it). Runs on the leader only: `leading`
/// gates the writes.
pub async fn run_job_gangs(
    client: Client,
    mut leading: tokio::sync::watch::Receiver<bool>,
    health: Arc<WatchHealth>,
) {
    use crate::translate::LABEL_GANG;
    use k8s_openapi::api::batch::v1::Job;
    let jobs: Api<Job> = Api::all(client.clone());
    let cfg = watcher::Config::default().labels(&format!("{LABEL_GANG}=true"));
    let mut stream = watcher::watcher(jobs, cfg).default_backoff().boxed();
    let mut done: BTreeSet<String> = BTreeSet::new();
    // Jobs seen while a standby: made into gangs once this replica leads
    // (else a Job created before the first election, or during a
    // failover, would wait for its next change to get its PodGroup)
    let mut waiting: BTreeMap<String, Job> = BTreeMap::new();
    let mut log = FailureLog::default();
    let mut leading_open = true;
    loop {
        let job = tokio::select! {
            ev = stream.next() => match ev {
                None => break,
                Some(Ok(Event::Apply(j))) | Some(Ok(Event::InitApply(j))) => j,
                Some(Ok(Event::InitDone)) => {
                    health.listed();
                    continue;
                }
                Some(Ok(Event::Delete(j))) => {
                    if let Some(uid) = j.metadata.uid.as_ref() {
                        waiting.remove(uid);
                    }
                    continue;
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    log.failed(&e, &health);
                    continue;
                }
            },
            r = leading.changed(), if leading_open => {
                leading_open = r.is_ok();
                if *leading.borrow() {
                    for (uid, job) in std::mem::take(&mut waiting) {
                        if job_gang(&client, &job).await {
                            done.insert(uid);
                        }
                    }
                }
                continue;
            }
        };
        let Some(uid) = job.metadata.uid.clone() else {
            continue;
        };
        if done.contains(&uid) {
            continue;
        }
        if !*leading.borrow() {
            waiting.insert(uid, job);
            continue;
        }
        if job_gang(&client, &job).await {
            done.insert(uid);
        }
    }
}

/// Creates the PodGroup of a gang Job; true once it exists.
async fn job_gang(client: &Client, job: &k8s_openapi::api::batch::v1::Job) -> bool {
    use crate::translate::{ANNOTATION_FOR_JOB, LABEL_QUEUE};
    let (Some(ns), Some(name), Some(uid)) = (
        job.metadata.namespace.clone(),
        job.metadata.name.clone(),
        job.metadata.uid.clone(),
    ) else {
        return false;
    };
    let min = job
        .spec
        .as_ref()
        .and_then(|s| s.parallelism)
        .unwrap_or(1)
        .max(1);
    let queue = job
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_QUEUE))
        .cloned();
    let pg = serde_json::json!({
        "apiVersion": "gpusched.io/v1alpha1", "kind": "PodGroup",
        "metadata": {
            "name": name, "namespace": ns,
            "annotations": {ANNOTATION_FOR_JOB: name},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                 "uid": uid, "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {"minMember": min, "queue": queue},
    });
    let pg: PodGroup = match serde_json::from_value(pg) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("job {ns}/{name}: {e}");
            return false;
        }
    };
    let api: Api<PodGroup> = Api::namespaced(client.clone(), &ns);
    match api.create(&crate::exec::post_params(), &pg).await {
        Ok(_) => {
            tracing::info!("created PodGroup {ns}/{name} (minMember {min}) for Job {ns}/{name}");
            true
        }
        Err(kube::Error::Api(s)) if s.code == 409 => true,
        Err(e) => {
            tracing::warn!("creating PodGroup for job {ns}/{name}: {e}");
            false
        }
    }
}
