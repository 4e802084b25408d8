//! The location mutations, fuzzed through their input: `createLocation`,
//! `updateLocation` and `transferStock` answer anything without an internal
//! error, and a refusal leaves the locations and the levels as they were
//! (beside everything `mutate` checks).

use super::*;
use crate::locations::{CREATE_LOCATION, UPDATE_LOCATION, default_location, run};
use crate::transfers::TRANSFER;

/// A generated call of one of the three mutations.
#[derive(Debug, Clone)]
enum Placing {
    Create(Value),
    Update(Value),
    Transfer { input: Value, version: Version, key: Option<Value> },
}

/// The locations and every level, as one string.
async fn places(app: &TestApp) -> String {
    let sql = "SELECT (SELECT md5(coalesce(string_agg(concat_ws(':', id, code, name, priority, active), ',' ORDER BY id), '')) \
                         FROM locations) || '|' || \
                      (SELECT md5(coalesce(string_agg(concat_ws(':', inventory_id, location_id, available), ',' \
                                                      ORDER BY inventory_id, location_id), '')) FROM stock_levels)";
    let row =
        app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
    row.try_get_by_index(0).expect("hashes")
}

/// Leaves out a field now and then, or sends it as anything.
fn optional(value: impl Strategy<Value = Value>) -> impl Strategy<Value = Option<Value>> {
    prop::option::weighted(0.7, value)
}

/// Sends one mutation as `caller` and checks what `mutate` checks, for
/// fields that may answer null (`updateLocation` of an unknown id) and
/// types that are no union: the transport; no data beside errors; when
/// refused, nothing written, locations and levels included; when answered,
/// the invariant, and every inventory's levels adding up to its stock.
async fn place(
    app: &TestApp,
    caller: &Caller,
    query: &str,
    variables: Value,
    field: &str,
) -> Result<(), TestCaseError> {
    let before = (state(app).await, places(app).await);
    let reply = post(app, caller.header(app).as_deref(), request(query, variables)).await;
    if check_transport(&reply, false)? {
        prop_assert!(reply.body["data"][field].is_null(), "data beside errors: {}", reply.body);
        prop_assert_eq!((state(app).await, places(app).await), before, "refused input wrote: {}", reply.body);
        return Ok(());
    }
    let drifts = invariant::check(&app.db).await.expect("invariant check");
    prop_assert!(drifts.is_empty(), "invariant broken after {}: {:?}", reply.body, drifts);
    let apart = app
        .count(
            "SELECT count(*) FROM inventories i WHERE i.stock <> \
               (SELECT coalesce(sum(available), 0) FROM stock_levels l WHERE l.inventory_id = i.id)",
        )
        .await;
    prop_assert_eq!(apart, 0, "levels apart from the stock after {}", reply.body);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn location_mutations_answer_any_input_without_internal_errors_and_refusals_write_nothing() {
    const CODES: &[&str] = &["default", "porto", "new-1", "Ünïcødé", "with spaces"];
    const NAMES: &[&str] = &["A place", "Armazém 🏬", "倉庫"];
    let (app, inventories) = server_with_stock().await;
    // Until `createInventory` writes it, every inventory's stock is put at
    // the default location here, as it will be.
    run(
        &app,
        "INSERT INTO stock_levels (inventory_id, location_id, available)
         SELECT i.id, l.id, i.stock FROM inventories i, locations l WHERE l.code = 'default' ON CONFLICT DO NOTHING",
        vec![],
    )
    .await;
    let default = default_location(&app).await;
    let other = crate::locations::create_location(&app, "porto", 10).await;
    let (places_known, inventories_known) = (vec![default, other], inventories.clone());
    let app = std::sync::Arc::new(app);
    let strategy = move || {
        let int = || prop_oneof![4 => select(vec![0, 1, -1, 100, i32::MIN, i32::MAX]).prop_map(Value::from), 1 => not_an_int()];
        let code = prop_oneof![3 => text(CODES), 2 => "[a-z]{1,8}".prop_map(Value::from)];
        let create = (code, text(NAMES), optional(int())).prop_map(|(code, name, priority)| {
            let mut input = json!({ "code": code, "name": name });
            set(&mut input, "priority", priority);
            Placing::Create(input)
        });
        let active = prop_oneof![select(vec![json!(true), json!(false)]), Just(json!("yes")), Just(json!(1))];
        let update = (uuid(places_known.clone()), optional(text(NAMES)), optional(int()), optional(active)).prop_map(
            |(id, name, priority, active)| {
                let mut input = json!({ "id": id });
                set(&mut input, "name", name);
                set(&mut input, "priority", priority);
                set(&mut input, "active", active);
                Placing::Update(input)
            },
        );
        let transfer = (
            uuid(inventories_known.clone()),
            uuid(places_known.clone()),
            uuid(places_known.clone()),
            quantity(),
            version(),
            idempotency_key(),
        )
            .prop_map(|(inventory, from, to, quantity, version, key)| Placing::Transfer {
                input: json!({ "inventoryId": inventory, "fromLocationId": from, "toLocationId": to, "quantity": quantity }),
                version,
                key,
            });
        (caller(Caller::Operator), prop_oneof![1 => create, 1 => update, 2 => transfer])
    };
    let shared = app.clone();
    for_64_cases(strategy, move |(caller, call)| {
        let app = shared.clone();
        async move {
            match call {
                Placing::Create(input) => {
                    place(&app, &caller, CREATE_LOCATION, json!({ "input": input }), "createLocation").await
                }
                Placing::Update(input) => {
                    place(&app, &caller, UPDATE_LOCATION, json!({ "input": input }), "updateLocation").await
                }
                Placing::Transfer { mut input, version, key } => {
                    let inventory = input["inventoryId"].clone();
                    set(&mut input, "expectedVersion", version.resolve(inventory_version(&app, &inventory)).await);
                    set(&mut input, "idempotencyKey", key);
                    place(&app, &caller, TRANSFER, json!({ "input": input }), "transferStock").await
                }
            }
        }
    })
    .await;
    assert_still_serving(&app).await;
}
