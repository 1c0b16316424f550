//! The one way gpusched builds its API client: from a kubeconfig file and
//! context when given (kubectl's `--kubeconfig`, `--context`), else
//! `$KUBECONFIG`, `~/.kube/config` or the in-cluster credentials. The
//! scheduler's loop, the tools (`doctor`, `snapshot capture`, `explain`)
//! and the tests all come through here.

use anyhow::Context;
use kube::Client;

/// A client from a kubeconfig file (its current context), or the
/// environment.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    KubeconfigChoice {
        path: kubeconfig.map(|p| p.to_path_buf()),
        context: None,
    }
    .client()
    .await
}

/// Which kubeconfig, and which of its contexts (kubectl's `--kubeconfig`
/// and `--context`).
#[derive(Clone, Debug, Default)]
pub struct KubeconfigChoice {
    /// The file (default: `$KUBECONFIG`, then `~/.kube/config`, then the
    /// in-cluster credentials).
    pub path: Option<std::path::PathBuf>,
    /// The context (default: the file's current context).
    pub context: Option<String>,
}

impl KubeconfigChoice {
    /// The namespace its context names, if the file and the context exist
    /// and it names one (kubectl's default for `--namespace`).
    pub fn context_namespace(&self) -> Option<String> {
        let kc = match &self.path {
            Some(p) => kube::config::Kubeconfig::read_from(p).ok()?,
            None => kube::config::Kubeconfig::read().ok()?,
        };
        let name = self.context.clone().or(kc.current_context.clone())?;
        kc.contexts
            .iter()
            .find(|c| c.name == name)?
            .context
            .as_ref()?
            .namespace
            .clone()
    }

    /// The client configuration it names. A missing or bad file, or an
    /// unknown context, is one error naming it.
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let opts = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let what = || match &self.context {
            Some(c) => format!(" (context {c:?})"),
            None => String::new(),
        };
        match &self.path {
            Some(p) => {
                let kc = kube::config::Kubeconfig::read_from(p)
                    .with_context(|| format!("reading kubeconfig {}", p.display()))?;
                kube::Config::from_custom_kubeconfig(kc, &opts)
                    .await
                    .with_context(|| format!("kubeconfig {}{}", p.display(), what()))
            }
            None if self.context.is_some() => kube::Config::from_kubeconfig(&opts)
                .await
                .with_context(|| format!("kubeconfig ($KUBECONFIG or ~/.kube/config){}", what())),
            None => kube::Config::infer()
                .await
                .context("finding cluster credentials (no kubeconfig, not in a pod)"),
        }
    }

    /// The API client of [`config`](Self::config).
    pub async fn client(&self) -> anyhow::Result<Client> {
        Client::try_from(self.config().await?).context("building the API client")
    }
}
