pub fn run(_a: &DecodeArgs) -> std::process::ExitCode {
    std::process::ExitCode::FAILURE
}
#[derive(Debug, clap::Args)]
pub struct DecodeArgs {}
