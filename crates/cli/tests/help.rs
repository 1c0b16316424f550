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
