//! `bank`: every `outbox` command on the bank's own journal and projections
//! (`migrate`, `work`, `report`, `replay`, `rebuild`, `runs`, ...), on SQLite
//! or Postgres as the URLs say.

use std::process::ExitCode;

fn main() -> ExitCode {
    outbox_cli::run(outbox_example_bank::app())
}
