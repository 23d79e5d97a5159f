//! The `isoswitch` command line: run, check, decode, sim.

/// mimalloc instead of glibc malloc: under connection churn (thousands of
/// short client connections a second) glibc keeps the freed per-connection
/// buffers in its heap and RSS ratchets up round after round (35 → 151 MB,
/// 85 % of it free memory that `malloc_trim` gives back); mimalloc returns
/// freed pages to the OS. Numbers and command in BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    isoswitch::cli::main()
}
