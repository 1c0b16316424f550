//! `gpusched simulate --openb … --config FILE`: the configuration's
//! `packing` arguments reach the `gpusched` policy of the FGD method, and
//! what the method cannot use is refused with the file named.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory with an openb node list (four 2-GPU nodes and an
/// 8-GPU node: 16 GPUs) and a pod list of twelve one-GPU pods and one
/// eight-GPU pod (20 GPUs, under the method's 130 %: every seed runs
/// exactly these pods, shuffled).
fn trace() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gpusched-openb-config-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("nodes.csv"),
        "sn,cpu_milli,memory_mib,gpu,model\n\
         small-0,64000,262144,2,T4\n\
         small-1,64000,262144,2,T4\n\
         small-2,64000,262144,2,T4\n\
         small-3,64000,262144,2,T4\n\
         big,64000,262144,8,G2\n",
    )
    .unwrap();
    let mut pods = String::from(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n",
    );
    for i in 0..12 {
        pods += &format!("one-{i},1000,1024,1,1000,,LS,Running,0,10,0\n");
    }
    pods += "eight,1000,1024,8,1000,,LS,Running,0,10,0\n";
    std::fs::write(dir.join("pods.csv"), pods).unwrap();
    dir
}

fn simulate(dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .arg("simulate")
        .arg("--openb")
        .arg(dir.join("nodes.csv"))
        .arg(dir.join("pods.csv"))
        .args(["--policies", "gpusched", "--seeds", "1-8", "--threads", "1"])
        .args(extra)
        .output()
        .unwrap()
}

/// The mean over seeds of the GPU allocation after the last pod (%).
fn final_alloc(out: &Output) -> f64 {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["results"][0]["result"]["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("no runs in {v}"));
    let sum: f64 = runs.iter().map(|r| r["finalAlloc"].as_f64().unwrap()).sum();
    sum / runs.len() as f64
}

fn stderr(out: &Output) -> String {
    assert!(!out.status.success(), "accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_configurations_gpusched_arguments_decide_the_placements() {
    let dir = trace();
    // with a coverage of 0.9 the target workload is the one-GPU class
    // alone (12 of 13 pods), for which no placement makes fragments: every
    // placement ties and the node-size order alone decides. Largest last
    // fills the 2-GPU nodes first and keeps the 8-GPU node for the 8-GPU
    // pod; more GPUs first breaks it with one-GPU pods.
    let cfg = |order: &str| {
        let p = dir.join(format!("{order}.yaml"));
        std::fs::write(
            &p,
            format!(
                "version: v1\npacking:\n  policy: gpusched\n  coverage: 0.9\n  size_order: {order}\n"
            ),
        )
        .unwrap();
        p
    };
    let run = |order: &str| {
        let out = simulate(&dir, &["--json", "--config", cfg(order).to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            err.contains("gpusched policy arguments from") && err.contains(order),
            "{err}"
        );
        final_alloc(&out)
    };
    let kept = run("largest-last");
    let broken = run("more-first");
    // more-first: the 8-GPU pod never fits, the twelve others do (75 %)
    assert_eq!(broken, 75.0);
    assert!(
        kept > broken,
        "largest-last {kept} %, more-first {broken} %"
    );
    let default = final_alloc(&simulate(&dir, &["--json"]));
    assert!(
        default > broken,
        "default {default} %, more-first {broken} %"
    );
}

#[test]
fn what_the_fgd_method_cannot_use_is_refused_with_the_file_named() {
    let dir = trace();
    // (file, its text, what the error must say besides the file's name)
    let cases: [(&str, &str, &[&str]); 3] = [
        // another policy: nothing to read
        (
            "fgd.yaml",
            "version: v1\npacking:\n  policy: fgd\n",
            &["\"fgd\"", "--policies"],
        ),
        // an argument outside its domain: the field
        (
            "bad.yaml",
            "version: v1\npacking:\n  policy: gpusched\n  coverage: 1.5\n",
            &["packing.coverage", "(0, 1]"],
        ),
        // an unknown field
        (
            "typo.yaml",
            "version: v1\npacking:\n  policy: gpusched\n  quantise_scale: 10\n",
            &["quantise_scale"],
        ),
    ];
    for (name, text, says) in cases {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        let e = stderr(&simulate(&dir, &["--config", p.to_str().unwrap()]));
        assert!(e.contains(name), "{e}");
        for s in says {
            assert!(e.contains(s), "{name}: no {s:?} in {e}");
        }
    }
    // the simulator's own flags have no meaning for the FGD method
    let e = stderr(&simulate(&dir, &["--policy", "fgd"]));
    assert!(e.contains("--policy") && e.contains("--openb"), "{e}");
}

/// A user's error is one `error: …` line with its causes and exit 1, never
/// a backtrace, even with RUST_BACKTRACE set (issue #22, 16).
#[test]
fn a_users_error_is_one_line_without_a_backtrace() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .args(["simulate", "--cluster", "/nonexistent/cluster.yaml"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("/nonexistent/cluster.yaml"), "{err}");
    assert!(!err.contains("backtrace"), "{err}");
    assert!(!err.contains("Stack"), "{err}");
}

/// `--progress` prints N of M runs and an ETA on stderr (a line per run
/// when stderr is not a terminal); stdout keeps only the result. Without
/// the flag a non-terminal stderr gets no progress lines.
#[test]
fn progress_goes_to_stderr_only_when_asked() {
    let dir = trace();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpusched"))
            .arg("simulate")
            .arg("--openb")
            .arg(dir.join("nodes.csv"))
            .arg(dir.join("pods.csv"))
            .args([
                "--policies",
                "gpusched,fgd",
                "--seeds",
                "1-2",
                "--threads",
                "1",
            ])
            .args(["--variants", "default,multigpu50"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (stdout, stderr) = run(&["--progress", "--json"]);
    // two variants × two policies
    for n in 1..=4 {
        assert!(
            stderr.contains(&format!("progress: {n} of 4 runs, ")),
            "{stderr}"
        );
    }
    assert!(stderr.contains("ETA "), "{stderr}");
    assert!(!stdout.contains("progress"), "{stdout}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    let (stdout, stderr) = run(&[]);
    assert!(!stderr.contains("progress:"), "{stderr}");
    assert!(!stdout.contains("progress:"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
