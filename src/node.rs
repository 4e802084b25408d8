//! Relay's object identification: the `Node` interface, a global `nodeId`
//! on every object that has an identity (inventories, reservations, orders,
//! ledger rows, locations, webhook endpoints), and `node(id:)` / `nodes(ids:)` to refetch any of them.
//!
//! The objects keep their `id: UUID!` (the contract never renames), so the
//! global id is a field of its own, `nodeId` (as PostGraphile names it);
//! Relay is told so with `nodeInterfaceIdField: "nodeId"`. A global id is
//! the base64 of `<Type>:<uuid>`: opaque to clients, and it says which
//! loader finds it. `node` respects visibility as the typed fields do:
//! someone else's reservation or order is `null`, a protected type without a
//! token is `UNAUTHENTICATED`, a ledger row or webhook endpoint for a customer
//! `FORBIDDEN`.

use async_graphql::{Context, ID, Interface, Object};
use base64::Engine as _;
use uuid::Uuid;

use crate::{
    error::{AppError, GqlResult, IntoGql},
    inventory::graphql::{self as inventory, Inventory, StockMovement},
    locations::graphql::{self as locations, Location},
    orders::graphql::{self as orders, Order},
    reservations::graphql::{self as reservations, Reservation},
    webhooks::graphql::{self as webhooks, WebhookEndpoint},
};

/// The kinds of object that have a global id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Inventory`.
    Inventory,
    /// `Reservation`.
    Reservation,
    /// `Order`.
    Order,
    /// `StockMovement`.
    StockMovement,
    /// `Location`.
    Location,
    /// `WebhookEndpoint`.
    WebhookEndpoint,
}

impl Kind {
    const ALL: [Self; 6] =
        [Self::Inventory, Self::Reservation, Self::Order, Self::StockMovement, Self::Location, Self::WebhookEndpoint];

    fn type_name(self) -> &'static str {
        match self {
            Self::Inventory => "Inventory",
            Self::Reservation => "Reservation",
            Self::Order => "Order",
            Self::StockMovement => "StockMovement",
            Self::Location => "Location",
            Self::WebhookEndpoint => "WebhookEndpoint",
        }
    }
}

/// The global id of the `kind` object with `id`.
pub fn global_id(kind: Kind, id: Uuid) -> ID {
    ID(base64::engine::general_purpose::STANDARD.encode(format!("{}:{id}", kind.type_name())))
}

/// The kind and UUID a global id names, if it is one.
fn decode(id: &str) -> Option<(Kind, Uuid)> {
    let text = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(id).ok()?).ok()?;
    let (name, uuid) = text.split_once(':')?;
    let kind = Kind::ALL.into_iter().find(|kind| kind.type_name() == name)?;
    Some((kind, Uuid::parse_str(uuid).ok()?))
}

/// An object with a global id, which `node(id:)` refetches.
#[derive(Interface)]
#[graphql(field(name = "node_id", ty = "ID", desc = "The object's global id, for `node(id:)` (Relay)."))]
pub enum Node {
    /// A stocked item.
    Inventory(Inventory),
    /// A hold on stock.
    Reservation(Reservation),
    /// An order.
    Order(Order),
    /// A ledger row.
    StockMovement(StockMovement),
    /// A place that holds stock.
    Location(Location),
    /// A URL events are sent to (operators).
    WebhookEndpoint(WebhookEndpoint),
}

/// Most ids one `nodes` call looks up.
const MAX_NODES: usize = 100;

/// Relay's root fields for any object with a global id.
#[derive(Default)]
pub struct NodeQuery;

#[Object]
impl NodeQuery {
    /// The object with this global id (`nodeId`), if the caller may see it.
    async fn node(&self, ctx: &Context<'_>, #[graphql(desc = "A `nodeId`.")] id: ID) -> GqlResult<Option<Node>> {
        let (kind, uuid) = decode(&id).ok_or_else(|| AppError::bad_input("id", "not a global id")).gql()?;
        find(ctx, kind, uuid).await
    }

    /// The objects with these global ids, in their order; `null` for each
    /// the caller may not see (a list cannot carry an error per element), at
    /// most 100 ids.
    async fn nodes(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "`nodeId`s, at most 100.")] ids: Vec<ID>,
    ) -> GqlResult<Vec<Option<Node>>> {
        if ids.len() > MAX_NODES {
            return Err(AppError::bad_input("ids", format!("at most {MAX_NODES} ids"))).gql();
        }
        let found = ids.iter().map(|id| async move {
            let (kind, uuid) = decode(id)?;
            find(ctx, kind, uuid).await.ok().flatten()
        });
        // Joined, so that the DataLoaders batch every lookup of one kind.
        Ok(futures::future::join_all(found).await)
    }
}

/// The `kind` object with `id`, as the typed root field would show it.
async fn find(ctx: &Context<'_>, kind: Kind, id: Uuid) -> GqlResult<Option<Node>> {
    Ok(match kind {
        Kind::Inventory => inventory::load(ctx, id).await?.map(Node::Inventory),
        Kind::Reservation => reservations::visible(ctx, id).await?.map(Node::Reservation),
        Kind::Order => orders::visible(ctx, id).await?.map(Node::Order),
        Kind::StockMovement => inventory::movement(ctx, id).await?.map(Node::StockMovement),
        Kind::Location => locations::load(ctx, id).await?.map(Node::Location),
        Kind::WebhookEndpoint => webhooks::visible(ctx, id).await?.map(Node::WebhookEndpoint),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_id_names_its_kind_and_uuid_and_nothing_else_is_one() {
        let id = Uuid::new_v4();
        for kind in Kind::ALL {
            assert_eq!(decode(&global_id(kind, id).0), Some((kind, id)));
        }
        assert_eq!(decode("not base64!"), None);
        assert_eq!(decode(&base64::engine::general_purpose::STANDARD.encode("Nope:1")), None);
        assert_eq!(decode(&base64::engine::general_purpose::STANDARD.encode(format!("Order:{id}x"))), None);
    }
}
