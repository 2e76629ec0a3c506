use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum BenchCmd {}

pub fn bench(b: BenchCmd) -> anyhow::Result<ExitCode> {
    match b {}
}
