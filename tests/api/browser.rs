//! GraphiQL at `/`, driven in a real Chromium by `clients/browser/graphiql.mjs`
//! (Playwright): the token typed into the Headers tab, a `reserve` typed into
//! the query editor, the run button clicked, and the answer checked in the
//! result pane and then in the database. Every request for anything but the
//! server is refused and fails the run: GraphiQL must work offline.

use std::{path::Path, time::Duration};

use serde_json::Value;
use stockguard::auth::Role;

use crate::{
    helpers::TestApp,
    node::{package, run},
};

const CHROMIUM: &str = "/usr/bin/chromium";

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Chromium (apt-get install chromium); .ci/run installs it and runs it"]
async fn graphiql_in_a_real_browser_runs_a_reservation_with_no_outside_request() {
    assert!(Path::new(CHROMIUM).exists(), "Chromium is not installed at {CHROMIUM} (apt-get install chromium)");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let client = package("browser").await;

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
    // The result pane shows what the request cost and what is left.
    let cost = &shown["extensions"]["cost"];
    assert!(cost["actualQueryCost"].as_i64().is_some_and(|cost| cost > 0), "{shown}");
    assert!(cost["throttleStatus"]["currentlyAvailable"].is_number(), "{shown}");

    assert_eq!(app.stock_and_version(id).await, (before.0 - 1, before.1 + 1), "one unit taken, one version up");
    assert!(Path::new(screenshot).exists(), "a screenshot at {screenshot}");
    app.assert_invariant().await;
}
