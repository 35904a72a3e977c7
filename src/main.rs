//! The `acp-sandbox` executable: parses the command line and hands over to the library.

mod cli;

fn main() -> anyhow::Result<std::process::ExitCode> {
    cli::main()
}
