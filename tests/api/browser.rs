//! GraphiQL at `/`, driven in a real Chromium by `clients/browser/graphiql.mjs`
//! (Playwright): the token typed into the Headers tab, a `reserve` typed into
//! the query editor, the run button clicked, and the answer checked in the
//! result pane and then in the database. Every request for anything but the
//! server is refused and fails the run: GraphiQL must work offline.

use std::{path::Path, process::Stdio, time::Duration};

use serde_json::Value;
use stockguard::auth::Role;
use tokio::process::Command;

use crate::helpers::TestApp;

const CHROMIUM: &str = "/usr/bin/chromium";

/// Runs `program args` in `dir` for at most `limit`; fails the test on a
/// non-zero exit or a timeout. Returns stdout.
async fn run(dir: &Path, program: &str, args: &[&str], limit: Duration) -> String {
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

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Chromium (apt-get install chromium); .ci/run installs it and runs it"]
async fn graphiql_in_a_real_browser_runs_a_reservation_with_no_outside_request() {
    assert!(Path::new(CHROMIUM).exists(), "Chromium is not installed at {CHROMIUM} (apt-get install chromium)");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let client = root.join("clients/browser");
    if !client.join("node_modules/playwright-core").exists() {
        run(&client, "npm", &["ci", "--no-audit", "--no-fund"], Duration::from_secs(300)).await;
    }

    let app = TestApp::spawn().await;
    let id = app.create_inventory("BROWSER-1", 5).await;
    let before = app.stock_and_version(id).await;
    let token = app.token("browser-user", Role::Customer);
    let screenshot = root.join("target/graphiql-reserve.png");
    let screenshot = screenshot.to_str().expect("a UTF-8 path");
    let id_text = id.to_string();

    let stdout =
        run(&client, "node", &["graphiql.mjs", &app.address, &token, &id_text, screenshot], Duration::from_secs(120))
            .await;
    let shown: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|err| panic!("{err}: {stdout}"));
    let reserve = &shown["data"]["reserve"];
    assert_eq!(reserve["__typename"], "Reserved", "{shown}");
    assert_eq!(reserve["reservation"]["quantity"], 1, "{shown}");
    assert_eq!(reserve["inventory"]["stock"], before.0 - 1, "{shown}");
    assert_eq!(reserve["inventory"]["version"], before.1 + 1, "{shown}");

    assert_eq!(app.stock_and_version(id).await, (before.0 - 1, before.1 + 1), "one unit taken, one version up");
    assert!(Path::new(screenshot).exists(), "a screenshot at {screenshot}");
    app.assert_invariant().await;
}
