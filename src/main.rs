//! The `isoswitch` command line: run, check, decode, sim.

fn main() -> std::process::ExitCode {
    isoswitch::cli::main()
}
