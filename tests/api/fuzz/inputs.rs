//! The values every mutation is fuzzed with: numbers, text, ids, versions,
//! idempotency keys, addresses, order lines and seconds, valid and not.

use super::*;

/// Things that are not a 32-bit integer: GraphQL refuses them as variables.
pub(super) fn not_an_int() -> impl Strategy<Value = Value> {
    select(vec![
        json!(2_147_483_648_i64),
        json!(-2_147_483_649_i64),
        json!(9_007_199_254_740_993_i64),
        json!(1.5),
        json!(1e300),
        json!("1"),
        json!(null),
        json!(true),
        json!([1]),
        json!({ "n": 1 }),
    ])
}

/// An `Int` for a quantity: mostly valid, often at or past the edges.
pub(super) fn quantity() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (1..=5_i32).prop_map(Value::from),
        1 => Just(json!(1000)),
        2 => select(vec![0, -1, 1001, i32::MIN, i32::MAX]).prop_map(Value::from),
        1 => any::<i32>().prop_map(Value::from),
        1 => not_an_int(),
    ]
}

/// Strings a client should never get away with, or that must be stored
/// exactly: empty, blank, 10 KiB, Unicode of every kind, NUL, SQL, random.
pub(super) fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            String::new(),
            " \t\n ".to_owned(),
            "x".repeat(10 * 1024),
            "🛒".repeat(300),
            "\u{0}".to_owned(),
            "a\u{0}b".to_owned(),
            "📦🔥🛒".to_owned(),
            "\u{202E}kcatta\u{202C}".to_owned(),
            "שלום עולם".to_owned(),
            "e\u{301}\u{301}\u{301}\u{301}".to_owned(),
            "\u{200B}\u{FEFF}".to_owned(),
            "'; DROP TABLE inventories; --".to_owned(),
            "' OR '1'='1".to_owned(),
            "\\\\".to_owned(),
            "%_%".to_owned(),
            "$1".to_owned(),
            "\"}]}".to_owned(),
        ]),
        vec(any::<char>(), 0..40).prop_map(String::from_iter),
        "[a-z]{1,8}".prop_map(|word| word.repeat(40)),
    ]
}

/// A string field: one of `valid`, or hostile text, or not a string at all.
pub(super) fn text(valid: &'static [&'static str]) -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => select(valid).prop_map(Value::from),
        2 => hostile_text().prop_map(Value::from),
        1 => select(vec![json!(42), json!(null), json!(["a"]), json!({ "a": 1 })]),
    ]
}

/// An inventory a well-behaved client names: mostly the first of `known`
/// (which has plenty of stock), sometimes another.
pub(super) fn plenty(known: &[Uuid]) -> impl Strategy<Value = Value> + use<> {
    prop_oneof![4 => Just(known[0]), 1 => select(known.to_vec())].prop_map(|id| json!(id))
}

/// A `UUID`: mostly one of `known`, else random, nil, or malformed.
pub(super) fn uuid(known: Vec<Uuid>) -> impl Strategy<Value = Value> {
    let spelled = known.clone();
    prop_oneof![
        6 => select(known).prop_map(|id| json!(id)),
        1 => any::<u128>().prop_map(|n| json!(Uuid::from_u128(n))),
        1 => Just(json!(Uuid::nil())),
        // Other spellings of a real id: the UUID scalar accepts some of them.
        1 => (select(spelled), 0..5_usize).prop_map(|(id, how)| {
            let id = id.to_string();
            json!(match how {
                0 => id.to_uppercase(),
                1 => format!("{{{id}}}"),
                2 => format!("{id}x"),
                3 => id[..35].to_owned(),
                _ => id.replace('-', ""),
            })
        }),
        1 => prop_oneof![
            select(vec!["", "not-a-uuid", "00000000-0000-0000-0000-00000000000g", "'; DROP TABLE inventories; --"])
                .prop_map(Value::from),
            hostile_text().prop_map(Value::from),
            select(vec![json!(42), json!(null), json!([])]),
        ],
    ]
}

/// The version a request expects, resolved against the database when sent.
#[derive(Debug, Clone)]
pub(super) enum Version {
    Omit,
    Current,
    Stale,
    Literal(Value),
}

/// A version a well-behaved client sends: none, or the one it just read.
pub(super) fn valid_version() -> impl Strategy<Value = Version> {
    prop_oneof![Just(Version::Omit), Just(Version::Current)]
}

pub(super) fn version() -> impl Strategy<Value = Version> {
    prop_oneof![
        4 => Just(Version::Omit),
        3 => Just(Version::Current),
        1 => Just(Version::Stale),
        1 => select(vec![0, -1, i32::MAX, i32::MIN]).prop_map(|v| Version::Literal(json!(v))),
        1 => any::<i32>().prop_map(|v| Version::Literal(json!(v))),
        1 => not_an_int().prop_map(Version::Literal),
    ]
}

impl Version {
    /// The value to send (none: leave the field out); `current` reads the
    /// row's version when the target is a real row.
    pub(super) async fn resolve(&self, current: impl Future<Output = Option<i32>>) -> Option<Value> {
        match self {
            Self::Omit => None,
            Self::Current => Some(json!(current.await.unwrap_or(1))),
            Self::Stale => Some(json!(current.await.unwrap_or(1) - 1)),
            Self::Literal(value) => Some(value.clone()),
        }
    }
}

pub(super) async fn inventory_version(app: &TestApp, id: &Value) -> Option<i32> {
    let id = id.as_str()?.parse().ok()?;
    scalar(app, "SELECT version FROM inventories WHERE id = $1", id).await
}

pub(super) async fn order_version(app: &TestApp, id: &Value) -> Option<i32> {
    let id = id.as_str()?.parse().ok()?;
    scalar(app, "SELECT version FROM orders WHERE id = $1", id).await
}

/// An idempotency key: mostly none, often one of a few (so replays and
/// reuses happen), sometimes hostile.
pub(super) fn idempotency_key() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        4 => Just(None),
        3 => select(vec!["k1", "k2", "k3"]).prop_map(|key| Some(json!(key))),
        1 => Just(Some(json!("k".repeat(129)))),
        1 => hostile_text().prop_map(|key| Some(json!(key))),
    ]
}

/// A well-behaved client's key: none, or a new one.
pub(super) fn fresh_key() -> impl Strategy<Value = Option<Value>> {
    prop::option::weighted(0.3, "[a-z0-9]{12}".prop_map(Value::from))
}

/// Sets `field` on `object` unless the value is to be left out.
pub(super) fn set(object: &mut Value, field: &str, value: Option<Value>) {
    if let Some(value) = value {
        object[field] = value;
    }
}

pub(super) fn valid_address() -> Value {
    json!({ "name": "Alice Example", "line1": "1 Main St", "line2": "Apt 4", "city": "Osaka",
            "postalCode": "530-0001", "country": "JP" })
}

pub(super) const ADDRESS_FIELDS: [&str; 6] = ["name", "line1", "line2", "city", "postalCode", "country"];

/// A shipping address: valid, or valid but for one field, or all fuzzed.
pub(super) fn address() -> impl Strategy<Value = Value> {
    pub(super) const NAMES: &[&str] = &["Alice", "Zoë Ångström", "山田太郎"];
    pub(super) const LINES: &[&str] = &["1 Main St", "221B Baker Street"];
    pub(super) const CITIES: &[&str] = &["Osaka", "Köln"];
    pub(super) const CODES: &[&str] = &["530-0001", "50667"];
    pub(super) const COUNTRIES: &[&str] = &["JP", "DE"];
    prop_oneof![
        3 => Just(valid_address()),
        3 => (select(ADDRESS_FIELDS.to_vec()), text(NAMES)).prop_map(|(field, value)| {
            let mut address = valid_address();
            address[field] = value;
            address
        }),
        1 => (text(NAMES), text(LINES), text(LINES), text(CITIES), text(CODES), text(COUNTRIES)).prop_map(
            |(name, line1, line2, city, postal_code, country)| {
                json!({ "name": name, "line1": line1, "line2": line2, "city": city,
                        "postalCode": postal_code, "country": country })
            }
        ),
    ]
}

/// One line of `reserveMany` / `placeOrder`.
#[derive(Debug, Clone)]
pub(super) struct Item {
    pub(super) inventory: Value,
    pub(super) quantity: Option<Value>,
    pub(super) version: Version,
}

impl Item {
    pub(super) async fn to_json(&self, app: &TestApp) -> Value {
        let mut item = json!({ "inventoryId": self.inventory });
        set(&mut item, "quantity", self.quantity.clone());
        set(&mut item, "expectedVersion", self.version.resolve(inventory_version(app, &self.inventory)).await);
        item
    }
}

pub(super) fn item(known: Vec<Uuid>) -> impl Strategy<Value = Item> {
    (uuid(known), prop::option::weighted(0.8, quantity()), version()).prop_map(|(inventory, quantity, version)| Item {
        inventory,
        quantity,
        version,
    })
}

/// Lines: a few, none, one inventory many times, or more than 100 inventories.
pub(super) fn items(known: Vec<Uuid>) -> impl Strategy<Value = Vec<Item>> {
    let one = Item { inventory: json!(Uuid::nil()), quantity: None, version: Version::Omit };
    let valid = (plenty(&known), 1..=3_i32, valid_version()).prop_map(|(inventory, quantity, version)| Item {
        inventory,
        quantity: Some(json!(quantity)),
        version,
    });
    prop_oneof![
        4 => vec(valid, 1..=3),
        4 => vec(item(known.clone()), 1..=4),
        1 => Just(vec![]),
        1 => (item(known), 2..=30_usize).prop_map(|(item, n)| vec![item; n]),
        1 => (101..=120_usize, any::<u64>()).prop_map(move |(n, seed)| {
            (0..n)
                .map(|i| Item {
                    inventory: json!(Uuid::from_u128((u128::from(seed) << 64) | i as u128)),
                    ..one.clone()
                })
                .collect()
        }),
    ]
}

/// Seconds for `extendReservation`.
pub(super) fn seconds() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => select(vec![1, 60, 3600]).prop_map(Value::from),
        2 => select(vec![0, -1, 3601, i32::MIN, i32::MAX]).prop_map(Value::from),
        2 => any::<i32>().prop_map(Value::from),
        1 => not_an_int(),
    ]
}

/// What a release, extend, confirm or cancel names.
#[derive(Debug, Clone)]
pub(super) enum Target {
    /// A reservation or order made for Alice just before the request.
    Fresh,
    Id(Value),
}

pub(super) fn target(known: Vec<Uuid>) -> impl Strategy<Value = Target> {
    prop_oneof![2 => Just(Target::Fresh), 5 => uuid(known).prop_map(Target::Id)]
}
