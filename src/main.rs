//! The `stockguard` binary: everything lives in the library; this only hands
//! the command line to it and turns a failure into exit code 1.

use std::process::ExitCode;

// A request allocates and frees many small objects (JSON, the GraphQL
// document and response, rows); glibc's allocator took a tenth of the
// server's CPU in the benchmark's profile, mimalloc a fraction of that.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match stockguard::cli::run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("stockguard: {err:#}");
            ExitCode::FAILURE
        }
    }
}
