//! `gpusched simulate --help` puts the everyday flags first and groups the
//! FGD-method and snapshot-replay flags under their own headings.

use std::process::Command;

#[test]
fn simulate_help_groups_the_method_flags_apart() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .args(["simulate", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing from:\n{text}"))
    };
    let fgd = at("FGD evaluation on an openb trace (--openb):");
    let replay = at("Replaying a captured cluster (--snapshot):");
    // main flags before either group
    for main in ["--cluster", "--workload", "--seed", "--report", "--json"] {
        assert!(
            at(main) < fgd,
            "{main} is not among the main flags:\n{text}"
        );
    }
    for method in [
        "--openb",
        "--policies",
        "--tie-break",
        "--variants",
        "--move-budget",
    ] {
        let i = at(&format!("      {method} "));
        assert!(
            i > fgd && i < replay,
            "{method} is not under the FGD heading:\n{text}"
        );
    }
    assert!(at("      --pod-duration ") > replay);
}

/// Run as `kubectl-gpusched` (kubectl's plugin name), the binary lists only
/// the plugin's verbs, with kubectl's flags on them.
#[test]
fn kubectl_plugin_help_lists_only_its_verbs() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("kubectl-gpusched");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gpusched"), &bin).unwrap();
    let help = |args: &[&str]| {
        let out = Command::new(&bin).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = help(&["--help"]);
    assert!(text.contains("Usage: kubectl gpusched"), "{text}");
    let verbs: Vec<&str> = text
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(verbs, ["explain", "pending", "doctor", "help"], "{text}");
    for verb in [
        &["pending", "--help"][..],
        &["explain", "pod", "--help"],
        &["doctor", "--help"],
    ] {
        let t = help(verb);
        for flag in [
            "--kubeconfig",
            "--context",
            "-n, --namespace",
            "-o, --output",
        ] {
            assert!(t.contains(flag), "{verb:?} lacks {flag}:\n{t}");
        }
    }
    // a verb of the full binary is not one of the plugin's
    let out = Command::new(&bin).arg("simulate").output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand 'simulate'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
