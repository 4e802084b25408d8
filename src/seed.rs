//! Demo inventory, so a new server has something to reserve at once.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait};

use crate::{error::AppError, inventory::service, stock::rows::inventory::Entity as Inventories};

/// SKU, name and stock of the demo items.
const DEMO: &[(&str, &str, i32)] = &[
    ("TICKET-ARENA-A1", "Arena concert, block A, seat row 1", 10),
    ("TICKET-ARENA-GA", "Arena concert, general admission", 500),
    ("TSHIRT-LOGO-M", "Logo T-shirt, size M", 120),
    ("SNEAKER-LTD-42", "Limited sneaker, EU 42", 3),
    ("ROOM-HARBOR-0701", "Harbor hotel, 7 January, double room", 1),
];

/// Adds the demo items whose SKUs are not taken yet; returns how many were added.
pub(crate) async fn seed(db: &DatabaseConnection) -> Result<usize, AppError> {
    let mut added = 0;
    for (sku, name, stock) in DEMO {
        match service::create(db, sku, name, *stock, None).await {
            Ok(_) => added += 1,
            Err(AppError::BadInput { .. }) => {} // SKU already there
            Err(err) => return Err(err),
        }
    }
    Ok(added)
}

/// Seeds only a database without inventories (a fresh one).
pub(crate) async fn seed_if_empty(db: &DatabaseConnection) -> Result<usize, AppError> {
    if is_empty(db).await? { seed(db).await } else { Ok(0) }
}

async fn is_empty(db: &impl ConnectionTrait) -> Result<bool, DbErr> {
    Ok(Inventories::find().count(db).await? == 0)
}
