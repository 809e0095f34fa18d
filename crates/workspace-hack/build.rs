//! Empty on purpose: cargo resolves `[build-dependencies]` only for a package with a build
//! script, and this crate's build-dependencies unify the features of crates that build scripts
//! and proc-macros use (see Cargo.toml).
fn main() {}
