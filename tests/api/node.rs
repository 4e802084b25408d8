//! Node.js programs in `clients/`, run from the tests: the browser driver
//! and the client libraries, each within a time bound, their packages
//! installed from the committed lockfile when missing.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::process::Command;

/// `clients/<name>`, with its `node_modules` installed (`npm ci`) if missing;
/// one install at a time, since tests run side by side.
pub async fn package(name: &str) -> PathBuf {
    static INSTALLING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients").join(name);
    let _one = INSTALLING.lock().await;
    if !dir.join("node_modules").exists() {
        run(&dir, "npm", &["ci", "--no-audit", "--no-fund"], Duration::from_secs(300)).await;
    }
    dir
}

/// Runs `program args` in `dir` for at most `limit`; fails the test on a
/// non-zero exit or a timeout. Returns stdout.
pub async fn run(dir: &Path, program: &str, args: &[&str], limit: Duration) -> String {
    let child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|err| panic!("start `{program}` (is Node.js installed?): {err}"));
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("`{program} {}` took longer than {limit:?}", args.join(" ")))
        .unwrap_or_else(|err| panic!("wait for `{program}`: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "`{program} {}` failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The JSON a program printed as its last line.
pub fn last_json(stdout: &str) -> serde_json::Value {
    let line = stdout.trim().lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {stdout}"))
}
