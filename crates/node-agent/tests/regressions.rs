//! Regression tests for defects found by driving the agent with a kubelet
//! stand-in and hostile inputs (issue 10). Each is named after its bug.

mod common;

use common::*;
use std::time::{Duration, Instant};

/// Two agents on one plugin directory took the socket from each other
/// forever (≈ 14 registrations/s, each dropping the kubelet's stream). The
/// second one must refuse to start, naming the holder, and the first must
/// keep its single registration.
#[tokio::test]
async fn two_agents_on_one_plugin_dir_livelock() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let first = start_agent(settings(dir.path(), "dgx-h100.yaml"));
    k.next_registration(Duration::from_secs(5)).await;
    let mut second = start_agent(settings(dir.path(), "dgx-h100.yaml"));
    let window = Duration::from_secs(2);
    let t0 = Instant::now();
    let exited = tokio::time::timeout(window, &mut second.task).await;
    // Count registrations over the whole window, whatever the second did.
    tokio::time::sleep(window.saturating_sub(t0.elapsed())).await;
    let mut n = 0u32;
    {
        let mut rx = k.registrations.lock().await;
        while rx.try_recv().is_ok() {
            n += 1;
        }
    }
    eprintln!(
        "two agents: {n} registrations in {:?} ({:.1}/s)",
        window,
        f64::from(n) / window.as_secs_f64()
    );
    match exited {
        Ok(r) => {
            let e = format!("{:#}", r.expect("agent task").unwrap_err());
            assert!(e.contains("another gpusched agent"), "{e}");
            assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        }
        Err(_) => {
            let _ = second.shutdown().await;
            panic!("the second agent kept running ({n} registrations in {window:?})");
        }
    }
    assert_eq!(n, 0, "the first agent re-registered {n} times");
    first.shutdown().await.unwrap();
}
