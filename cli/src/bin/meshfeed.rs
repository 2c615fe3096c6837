//! The `meshfeed` binary: the command line of [`meshfeed_cli`].

fn main() {
    std::process::exit(meshfeed_cli::main_with_args(std::env::args_os().collect()));
}
