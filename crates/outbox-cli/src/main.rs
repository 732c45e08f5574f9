//! The stock `outbox` binary: every command that needs no projections works
//! on any application's databases; an application with projections builds its
//! own binary with [`outbox_cli::run`].

fn main() -> std::process::ExitCode {
    outbox_cli::run(outbox_cli::App::new("outbox"))
}
