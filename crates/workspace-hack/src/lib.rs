//! Empty on purpose: this crate exists for its `Cargo.toml` (feature unification for the Python
//! extension's build; see there).
