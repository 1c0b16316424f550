//! What the cluster-facing verbs share with kubectl: `--kubeconfig`,
//! `--context` and `-o/--output`, and `kubectl gpusched` itself (the
//! binary run as `kubectl-gpusched`: only the verbs a kubectl user needs).

use clap::{Args, ValueEnum};
use gpusched_k8s::debug::KubeconfigChoice;
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
