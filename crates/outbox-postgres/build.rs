//! Rebuilds the crate when an embedded migration changes (`sqlx::migrate!`
//! reads them at compile time).

fn main() {
    println!("cargo:rerun-if-changed=../../migrations/postgres/journal");
    println!("cargo:rerun-if-changed=../../migrations/postgres/projection");
}
