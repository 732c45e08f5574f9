//! The `outbox` binary.

fn main() -> std::process::ExitCode {
    outbox_cli::main()
}
