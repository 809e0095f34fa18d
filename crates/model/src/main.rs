//! `tessera-model`: checks the write protocol's model exhaustively (`make model`).
//!
//! `tessera-model` runs the default size exhaustively ([`Config::small`]: 3 + 2, one writer
//! beside the initial version, one fault, one outage); `--large` runs [`Config::large`].
//! `--k N`, `--m N`, `--faults N`, `--impairments N`, `--writers N` and `--clock-skew` change
//! the bounds after that; `--depth N` explores only the states within N steps (two writers do
//! not fit an exhaustive run: `--writers 2 --k 1 --m 1 --depth 16` is 9.5 million states,
//! about 70 s, and reaches re-stamps).
//! Prints one line on success; on a counterexample prints its trace and exits 1.

use std::process::ExitCode;
use std::time::Instant;

use model::{Config, Fixes, INVARIANTS, WriteModel};
use stateright::{Checker, HasDiscoveries, Model};

fn main() -> ExitCode {
    let (config, depth) = match parse(std::env::args().skip(1)) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let model = WriteModel::new(config.clone());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    let mut builder = model.clone().checker().threads(threads).finish_when(HasDiscoveries::AnyFailures);
    if let Some(depth) = depth {
        builder = builder.target_max_depth(usize::from(depth));
    }
    let checker = builder.spawn_bfs().join();
    let mut failed = false;
    for property in INVARIANTS {
        if let Some(path) = checker.discovery(property) {
            eprintln!("error: {property} violated:\n{}", model::render(&model, &path));
            failed = true;
        }
    }
    for property in model.properties().iter().filter(|p| !p.expectation.discovery_is_failure()) {
        if !failed && checker.discovery(property.name).is_none() {
            eprintln!("error: the model never reached a state with {}: check its bounds", property.name);
            failed = true;
        }
    }
    if failed {
        return ExitCode::FAILURE;
    }
    let bound = depth.map_or(String::new(), |d| format!(" within {d} steps"));
    println!(
        "model: {} states explored{bound} (k={} m={}, {} writer{}, {} faults, {} outages) in {:.1} s, invariants checked: {}",
        checker.unique_state_count(),
        config.k,
        config.m,
        config.writers,
        if config.writers == 1 { "" } else { "s" },
        config.faults_max,
        config.impairments_max,
        started.elapsed().as_secs_f64(),
        INVARIANTS.join(", "),
    );
    ExitCode::SUCCESS
}

/// The configuration, and the depth bound (`--depth N`: every state within N steps; none: all).
fn parse(mut args: impl Iterator<Item = String>) -> Result<(Config, Option<u8>), String> {
    let mut config = Config::small(Fixes::ALL);
    let mut depth = None;
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u8, String> {
            let value = args.next().ok_or(format!("{name} needs a number"))?;
            value.parse().map_err(|_| format!("{name} needs a number, not {value:?}"))
        };
        match arg.as_str() {
            "--large" => config = Config { fixes: config.fixes, ..Config::large(Fixes::ALL) },
            "--faults" => config.faults_max = number("--faults")?,
            "--impairments" => config.impairments_max = number("--impairments")?,
            "--writers" => config.writers = number("--writers")?.clamp(1, 3),
            "--k" => config.k = number("--k")?.clamp(1, 6),
            "--m" => config.m = number("--m")?.clamp(1, 3),
            "--depth" => depth = Some(number("--depth")?),
            "--clock-skew" => config.clock_skew = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?}: use --large, --k N, --m N, --faults N, --impairments N, --writers N, --clock-skew, --depth N"
                ));
            }
        }
    }
    Ok((config, depth))
}
