//! End-to-end: `scripts/tryout up`, then every command it prints, run
//! literally and in order in one shell as a new user pastes them (#39 item
//! 1): each exits 0, `gpusched doctor` finds nothing to warn of on the
//! healthy try-out, and `kubectl gpusched` reaches the scheduler that runs
//! outside the cluster. Needs kubectl and kube-controller-manager (tier 2
//! of `e2e/run`); `scripts/tryout down` runs whatever happens.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `scripts/tryout down` when the test ends, passed or not (before the
/// temporary directory holding the try-out's goes).
struct Down {
    tmp: tempfile::TempDir,
}

impl Down {
    fn dir(&self) -> PathBuf {
        self.tmp.path().join("tryout")
    }
}

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(root().join("scripts/tryout"))
            .arg("down")
            .env("GPUSCHED_TRYOUT_DIR", self.dir())
            .status();
    }
}

/// The commands `up` prints: the indented lines after "Where to look",
/// up to "The scheduler's log".
fn printed_commands(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| !l.starts_with("Where to look"))
        .take_while(|l| !l.starts_with("The scheduler's log"))
        .filter(|l| l.starts_with("  "))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
#[ignore = "needs the e2e control plane, kube-controller-manager and kubectl: e2e/run"]
fn every_command_the_tryout_prints_works() {
    let kubectl = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !kubectl {
        eprintln!("SKIPPED: scripts/tryout needs kubectl on PATH");
        return;
    }
    let down = Down {
        tmp: tempfile::tempdir().unwrap(),
    };
    let dir = down.dir();
    let up = Command::new(root().join("scripts/tryout"))
        .arg("up")
        .env("GPUSCHED_BIN", env!("CARGO_BIN_EXE_gpusched"))
        .env("GPUSCHED_TRYOUT_DIR", &dir)
        .env_remove("KUBECONFIG")
        .env_remove("GPUSCHED_ENDPOINT")
        .output()
        .unwrap();
    // where to look on stdout, the progress on stderr
    let printed = String::from_utf8_lossy(&up.stdout).into_owned();
    assert!(
        up.status.success(),
        "scripts/tryout up failed:\n{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let commands = printed_commands(&printed);
    assert!(
        commands.len() >= 10 && commands[0].starts_with("export "),
        "{commands:#?}\n{printed}"
    );

    // one shell, in order (the export holds for the rest), each command's
    // output and exit code kept apart
    let logs = down.tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut script = String::new();
    for (i, c) in commands.iter().enumerate() {
        let l = logs.display();
        script.push_str(&format!(
            "{{\n{c}\n}} >{l}/{i}.out 2>&1 </dev/null\necho $? >{l}/{i}.rc\n"
        ));
    }
    let sh = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(down.tmp.path())
        .env_remove("KUBECONFIG")
        .env_remove("GPUSCHED_ENDPOINT")
        .status()
        .unwrap();
    assert!(sh.success());
    let mut failed = Vec::new();
    let mut doctor = None;
    for (i, c) in commands.iter().enumerate() {
        let rc = std::fs::read_to_string(logs.join(format!("{i}.rc"))).unwrap();
        let out = std::fs::read_to_string(logs.join(format!("{i}.out"))).unwrap();
        // the transcript (--nocapture shows it)
        eprintln!("$ {c}  [exit {}]", rc.trim());
        if rc.trim() != "0" {
            failed.push(format!("$ {c}\n[exit {}]\n{out}", rc.trim()));
        }
        if c.starts_with("gpusched doctor") {
            doctor = Some(out.clone());
        }
        if c.starts_with("kubectl gpusched explain pod train-0") {
            assert!(out.contains("h100-"), "{c}:\n{out}");
        }
    }
    assert!(
        failed.is_empty(),
        "printed commands that failed:\n{}",
        failed.join("\n")
    );
    let doctor = doctor.expect("the try-out prints gpusched doctor");
    assert!(
        doctor.contains("0 failure(s), 0 warning(s)"),
        "doctor on the healthy try-out:\n{doctor}"
    );
    drop(down);
}

#[test]
fn the_printed_block_is_read_as_a_user_reads_it() {
    let text = "tryout: up\n\nWhere to look. First:\n  export A=1\n  kubectl get pods\nTry this:\n  gpusched pending   # why\nThe scheduler's log: x\n  not a command\n";
    assert_eq!(
        printed_commands(text),
        ["export A=1", "kubectl get pods", "gpusched pending   # why"]
    );
}
