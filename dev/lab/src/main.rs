//! The lab's sweeps and diagnostics, as JSON lines in the format of `cubellm bench`:
//!
//! ```text
//! lab [--runtime cuda|wgpu|auto] addlab [FILTER]          # the add investigation's cases
//! lab [--runtime cuda|wgpu|auto] sparse-tune FILTER[,..]  # every launch shape of the BSR cases
//! lab [--runtime cuda|wgpu|auto] samplelab [FILTER]       # the device sampler's kernels
//! lab [--runtime cuda] persistent [FILTER]                # the persistent step's weight stream
//! ```
//!
//! `sparse-tune` times every launch shape of the block-sparse benchmark cases whose names
//! contain one of the comma-separated filters (e.g. `"4096x4096 s70,m16"`), to choose defaults.

use std::process::ExitCode;

use runtime::RuntimeChoice;

fn run(args: &[String]) -> Result<(), String> {
    let mut choice = RuntimeChoice::Auto;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--runtime" {
            let v = it.next().ok_or("--runtime needs a value")?;
            choice = v.parse().map_err(|e| format!("{e}"))?;
        } else {
            rest.push(a.as_str());
        }
    }
    let usage = "usage: lab [--runtime cuda|wgpu|auto] addlab [FILTER] | samplelab [FILTER] | persistent [FILTER] | sparse-tune FILTER[,FILTER..]";
    let (family, filter) = match rest[..] {
        ["addlab"] => ("addlab", ""),
        ["samplelab"] => ("samplelab", ""),
        ["persistent"] => ("persistent", ""),
        ["addlab", filter]
        | ["samplelab", filter]
        | ["persistent", filter]
        | ["sparse-tune", filter] => (rest[0], filter),
        _ => return Err(usage.into()),
    };
    let backend = runtime::resolve(choice).map_err(|e| e.to_string())?;
    eprintln!("runtime: {backend}");
    runtime::with_runtime!(backend, |client: R| {
        if family == "addlab" {
            let cases = lab::addlab::cases::<R>(&client);
            bench::measure(&client, "addlab", cases, filter);
        } else if family == "persistent" {
            let mut cases = lab::persistent::cases::<R>(&client, filter);
            cases.extend(lab::persistent_gemv::cases::<R>(&client, filter));
            bench::measure(&client, "persistent", cases, filter);
        } else if family == "samplelab" {
            let cases = lab::samplelab::cases::<R>(&client);
            bench::measure(&client, "samplelab", cases, filter);
        } else {
            let filters: Vec<&str> = filter.split(',').collect();
            let cases = bench::sparse::tune_cases(&client, &filters);
            bench::measure(&client, "sparse-tune", cases, "");
        }
    });
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
