//! Rebuilds the crate when an embedded migration changes (`sqlx::migrate!`
//! reads them at compile time). The crate's `migrations/` is a copy of the
//! workspace's `migrations/postgres/`, kept equal by `cargo xtask sync-migrations`
//! and checked by `cargo xtask ci`.

fn main() {
    println!("cargo:rerun-if-changed=migrations/journal");
    println!("cargo:rerun-if-changed=migrations/projection");
}
