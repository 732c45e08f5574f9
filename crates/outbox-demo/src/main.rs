//! `outbox-demo`: every `outbox` command on the demo's projections, plus
//! `outbox-demo demo`, the whole lifecycle on fresh SQLite files.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use outbox_cli::{Cli, GlobalArgs};
use outbox_demo::domain::{Faults, app};
use outbox_demo::scenario::{DemoArgs, demo};

/// The outbox demo: a tabletop campaign.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true, max_term_width = 100)]
struct DemoCli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: DemoCommand,
}

#[derive(Debug, Subcommand)]
enum DemoCommand {
    /// Run the tabletop-campaign demo on fresh SQLite files.
    Demo(DemoArgs),
    #[command(flatten)]
    Outbox(outbox_cli::Command),
}

fn main() -> ExitCode {
    // The injected faults are the demo scenario's; every other command runs
    // with the fix deployed, as an operator would after it.
    let faults = Faults::default();
    faults.deploy_fix();
    let app = app(&faults);
    let cli: DemoCli = match outbox_cli::parse("outbox-demo", None, std::env::args_os().collect()) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        DemoCommand::Demo(args) => {
            let log = cli.global.log.clone();
            outbox_cli::drive("outbox-demo", log.as_deref(), "error", demo(args))
        }
        DemoCommand::Outbox(command) => outbox_cli::run_cli(
            app,
            Cli {
                global: cli.global,
                command,
            },
        ),
    }
}
