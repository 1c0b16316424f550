//! KubeRay: RayClusters start whole, failed workers are replaced, queues share.

use super::*;

/// A RayCluster: a head without GPUs and `workers` workers of `gpus`.
fn ray_cluster(name: &str, queue: &str, workers: u32, gpus: u32) -> Value {
    json!({"apiVersion": "ray.io/v1", "kind": "RayCluster",
           "metadata": {"name": name, "labels": {"gpusched.io/queue": queue}},
           "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template(0, "Always")},
                    "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers,
                        "minReplicas": workers, "maxReplicas": workers, "rayStartParams": {},
                        "template": template(gpus, "Never")}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the operators: e2e/run"]
async fn ray_clusters_start_whole_replace_failed_workers_and_share() {
    let bed = Bed::up("kuberay").await;
    let (c, pods) = (&bed.c, &bed.pods);
    // head + workers
    let size = |name: &str| -> usize {
        match name {
            "fits" => 4,
            "toobig" => 3,
            _ => 2,
        }
    };

    // head + 3 workers × 4 GPUs (12 of 16): starts whole
    create_workload(&c.client, "ml", ray_cluster("fits", "a", 3, 4)).await;
    poll(pods, &size, 120, "fits starts whole", |g| {
        bound_of(g, "fits") == 4
    })
    .await;
    // a worker fails: KubeRay deletes it and makes another, which gpusched
    // places beside the running gang
    let worker = running_members(pods, "fits")
        .await
        .into_keys()
        .find(|n| n.contains("-gpu-"))
        .expect("a worker of fits");
    let new = fail_and_replace(pods, "fits", &worker, 1, 4).await;
    assert!(new.contains("-gpu-"), "the replacement is a worker: {new}");

    // head + 2 workers × 4 GPUs with 4 free: none starts, the head neither
    create_workload(&c.client, "ml", ray_cluster("toobig", "a", 2, 4)).await;
    bed.toobig_waits_then_queues_share(
        &size,
        ("ray.io/v1", "RayCluster"),
        &[("ray.io/v1", "RayCluster", "fits")],
        // head + 1 worker × 8 GPUs
        &|n, q| ray_cluster(n, q, 1, 8),
    )
    .await;
}
