//! The `stockguard` binary: everything lives in the library; this only hands
//! the command line to it and turns a failure into exit code 1.

use std::process::ExitCode;

fn main() -> ExitCode {
    match stockguard::cli::run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("stockguard: {err:#}");
            ExitCode::FAILURE
        }
    }
}
