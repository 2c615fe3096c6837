//! The `meshfeed` binary: parse, run, print errors once, pick the exit code.

fn main() {
    std::process::exit(meshfeed::cli::main_with_args(std::env::args_os()));
}
