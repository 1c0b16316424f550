//! `gpusched simulate`.

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct SimulateArgs {
    #[command(flatten)]
    pub openb: crate::openb::OpenbArgs,
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if args.openb.is_requested() {
        return crate::openb::run(&args.openb);
    }
    anyhow::bail!("not implemented yet")
}
