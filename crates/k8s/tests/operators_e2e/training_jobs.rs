//! Kubeflow training-operator jobs start whole, failed replicas retry, queues share.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the operators: e2e/run"]
async fn training_operator_jobs_start_whole_retry_failed_replicas_and_share() {
    let bed = Bed::up("training-operator").await;
    let (c, pods) = (&bed.c, &bed.pods);
    let size = |name: &str| -> usize {
        match name {
            "pt" => 4,
            "tf" => 3,
            "mpi" => 3,
            "toobig" => 3,
            _ => 2,
        }
    };

    // PyTorchJob: master + 3 workers × 2 GPUs (8 of 16): starts whole
    create_workload(
        &c.client,
        "ml",
        kubeflow(
            "PyTorchJob",
            "v1",
            "pt",
            "a",
            &[("Master", 1, 2), ("Worker", 3, 2)],
        ),
    )
    .await;
    poll(pods, &size, 120, "the PyTorchJob starts whole", |g| {
        bound_of(g, "pt") == 4
    })
    .await;
    // a worker fails with a retryable exit code: the operator deletes it and
    // makes it again, and gpusched places it
    let new = fail_and_replace(pods, "pt", "pt-worker-1", 137, 4).await;
    assert_eq!(new, "pt-worker-1", "recreated under its own name");

    // TFJob: 1 parameter server without GPUs + 2 workers × 2 GPUs: starts
    // whole in the 8 GPUs left
    create_workload(
        &c.client,
        "ml",
        kubeflow("TFJob", "v1", "tf", "a", &[("PS", 1, 0), ("Worker", 2, 2)]),
    )
    .await;
    poll(pods, &size, 120, "the TFJob starts whole", |g| {
        bound_of(g, "tf") == 3
    })
    .await;

    // v1 MPIJob (the training-operator's): launcher + 2 workers × 2 GPUs,
    // the launcher made with the workers; 4 GPUs left: starts whole
    create_workload(
        &c.client,
        "ml",
        kubeflow(
            "MPIJob",
            "v1",
            "mpi",
            "a",
            &[("Launcher", 1, 0), ("Worker", 2, 2)],
        ),
    )
    .await;
    poll(pods, &size, 120, "the v1 MPIJob starts whole", |g| {
        bound_of(g, "mpi") == 3
    })
    .await;

    // a PyTorchJob of master + 2 workers × 4 GPUs with 0 free: none starts
    create_workload(
        &c.client,
        "ml",
        kubeflow(
            "PyTorchJob",
            "v1",
            "toobig",
            "a",
            &[("Master", 1, 4), ("Worker", 2, 4)],
        ),
    )
    .await;
    bed.toobig_waits_then_queues_share(
        &size,
        ("kubeflow.org/v1", "PyTorchJob"),
        &[
            ("kubeflow.org/v1", "PyTorchJob", "pt"),
            ("kubeflow.org/v1", "TFJob", "tf"),
            ("kubeflow.org/v1", "MPIJob", "mpi"),
        ],
        // master + worker × 4 GPUs
        &|n, q| {
            kubeflow(
                "PyTorchJob",
                "v1",
                n,
                q,
                &[("Master", 1, 4), ("Worker", 1, 4)],
            )
        },
    )
    .await;
}
