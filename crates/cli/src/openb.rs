//! `gpusched simulate --openb NODES.csv PODS.csv`: the FGD evaluation method.

use clap::Args;

#[derive(Args, Debug, Clone, Default)]
pub struct OpenbArgs {
    /// Run the FGD evaluation method on an openb trace: NODES.csv PODS.csv.
    #[arg(long, num_args = 2, value_names = ["NODES_CSV", "PODS_CSV"])]
    pub openb: Option<Vec<std::path::PathBuf>>,
}

impl OpenbArgs {
    pub fn is_requested(&self) -> bool {
        self.openb.is_some()
    }
}

pub fn run(args: &OpenbArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("not implemented yet")
}
