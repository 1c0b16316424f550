//! MPI-operator jobs start whole, a failed launcher retries, queues share.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the operators: e2e/run"]
async fn mpi_operator_jobs_start_whole_retry_a_failed_launcher_and_share() {
    let bed = Bed::up("mpi-operator").await;
    let (c, pods) = (&bed.c, &bed.pods);
    // launcher + workers
    let size = |name: &str| -> usize {
        match name {
            "fits" => 4,
            "toobig" => 3,
            _ => 2,
        }
    };

    // launcher (no GPU) + 3 workers × 4 GPUs: starts whole
    create_workload(
        &c.client,
        "ml",
        kubeflow(
            "MPIJob",
            "v2beta1",
            "fits",
            "a",
            &[("Launcher", 1, 0), ("Worker", 3, 4)],
        ),
    )
    .await;
    poll(pods, &size, 120, "fits starts whole", |g| {
        bound_of(g, "fits") == 4
    })
    .await;
    // the launcher fails: its Job (backoffLimit 3) makes another launcher
    // pod, which gpusched places beside the running workers
    let launcher = running_members(pods, "fits")
        .await
        .into_keys()
        .find(|n| n.contains("launcher"))
        .expect("the launcher of fits");
    let new = fail_and_replace(pods, "fits", &launcher, 1, 4).await;
    assert!(
        new.contains("launcher"),
        "the replacement is a launcher: {new}"
    );

    // launcher + 2 workers × 4 GPUs with 4 free: none starts
    create_workload(
        &c.client,
        "ml",
        kubeflow(
            "MPIJob",
            "v2beta1",
            "toobig",
            "a",
            &[("Launcher", 1, 0), ("Worker", 2, 4)],
        ),
    )
    .await;
    bed.toobig_waits_then_queues_share(
        &size,
        ("kubeflow.org/v2beta1", "MPIJob"),
        &[("kubeflow.org/v2beta1", "MPIJob", "fits")],
        // launcher + 1 worker × 8 GPUs
        &|n, q| {
            kubeflow(
                "MPIJob",
                "v2beta1",
                n,
                q,
                &[("Launcher", 1, 0), ("Worker", 1, 8)],
            )
        },
    )
    .await;
}
