//! What the cluster-facing verbs share with kubectl: `--kubeconfig`,
//! `--context` and `-o/--output`, and `kubectl gpusched` itself (the
//! binary run as `kubectl-gpusched`: only the verbs a kubectl user needs).

use clap::{Args, ValueEnum};
use gpusched_k8s::client::KubeconfigChoice;
use std::path::PathBuf;

/// kubectl's connection flags.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeFlags {
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then
    /// in-cluster credentials).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl KubeFlags {
    pub fn choice(&self) -> KubeconfigChoice {
        KubeconfigChoice {
            path: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
    }
}

/// `-o`: how a report is printed.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// Text for people (the default).
    #[default]
    Text,
    /// Text with every column (tables) — the same as text for reports.
    Wide,
    /// JSON (camelCase field names, as Kubernetes objects).
    Json,
    /// YAML (the JSON's fields).
    Yaml,
}

/// Prints `r` as `out` says; a closed pipe (`| head`) is not an error.
pub fn print<T: serde::Serialize>(
    r: &T,
    out: Output,
    text: impl FnOnce(bool) -> String,
) -> anyhow::Result<()> {
    use std::io::Write;
    let s = match out {
        Output::Json => serde_json::to_string_pretty(r)? + "\n",
        Output::Yaml => serde_saphyr::to_string(r)?,
        Output::Text => text(false),
        Output::Wide => text(true),
    };
    let mut o = std::io::stdout().lock();
    match o.write_all(s.as_bytes()).and_then(|_| o.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// The namespace of the kubeconfig's context (kubectl's default for `-n`),
/// else `default`.
pub fn default_namespace(k: &KubeFlags) -> String {
    k.choice()
        .context_namespace()
        .unwrap_or_else(|| "default".to_string())
}

/// kubectl's habit `kubectl gpusched --context prod -n ml explain pod x`:
/// the connection and output flags given before the verb move after the
/// verb's arguments, where the verbs take them. Other arguments stay as
/// they are (clap reports what it does not know).
pub fn flags_last(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const WITH_VALUE: [&str; 5] = ["--kubeconfig", "--context", "--namespace", "-n", "-o"];
    const WITH_VALUE_LONG: [&str; 1] = ["--output"];
    let mut it = args.into_iter();
    let mut out: Vec<std::ffi::OsString> = it.next().into_iter().collect();
    let mut moved = Vec::new();
    let mut rest: Vec<std::ffi::OsString> = it.collect();
    while let Some(first) = rest.first().and_then(|a| a.to_str()).map(str::to_string) {
        let name = first.split_once('=').map_or(first.as_str(), |(n, _)| n);
        let takes_value = WITH_VALUE.contains(&name) || WITH_VALUE_LONG.contains(&name);
        if !takes_value {
            break;
        }
        moved.push(rest.remove(0));
        if !first.contains('=') && !rest.is_empty() {
            moved.push(rest.remove(0));
        }
    }
    out.extend(rest);
    out.extend(moved);
    out
}

#[cfg(test)]
mod tests {
    use super::flags_last;

    fn run(a: &[&str]) -> Vec<String> {
        flags_last(a.iter().map(|s| s.into()).collect())
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect()
    }

    #[test]
    fn flags_before_the_verb_move_after_it() {
        assert_eq!(
            run(&["k", "--context", "prod", "-n", "ml", "explain", "pod", "x"]),
            ["k", "explain", "pod", "x", "--context", "prod", "-n", "ml"]
        );
        assert_eq!(
            run(&["k", "--kubeconfig=/kc", "-o", "json", "pending"]),
            ["k", "pending", "--kubeconfig=/kc", "-o", "json"]
        );
        // nothing to move, or a flag the plugin does not know: unchanged
        assert_eq!(
            run(&["k", "pending", "-n", "ml"]),
            ["k", "pending", "-n", "ml"]
        );
        assert_eq!(
            run(&["k", "--bogus", "pending"]),
            ["k", "--bogus", "pending"]
        );
    }
}
