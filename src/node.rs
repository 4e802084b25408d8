//! Relay's object identification: the `Node` interface, a global `nodeId`
//! on every object that has an identity (inventories, reservations, orders,
//! ledger rows, locations, webhook endpoints, kits, kit reservations), and `node(id:)` / `nodes(ids:)` to refetch any of them.
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
use uuid::Uuid;

use crate::{
    error::{AppError, GqlResult, IntoGql},
    global_id::{Kind, decode},
    inventory::graphql::{self as inventory, Inventory, StockMovement},
    kits::graphql::{self as kits, Kit, KitReservation},
    locations::graphql::{self as locations, Location},
    orders::graphql::{self as orders, Order},
    reservations::graphql::{self as reservations, Reservation},
    waitlists::graphql::{self as waitlists, WaitlistEntry},
    webhooks::graphql::{self as webhooks, WebhookEndpoint},
};

/// An object with a global id, which `node(id:)` refetches.
#[derive(Interface)]
#[graphql(field(name = "node_id", ty = "ID", desc = "The object's global id, for `node(id:)` (Relay)."))]
pub(crate) enum Node {
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
    /// Several inventories sold as one.
    Kit(Kit),
    /// A hold on kits.
    KitReservation(KitReservation),
    /// A customer in line for freed units.
    WaitlistEntry(WaitlistEntry),
}

/// Most ids one `nodes` call looks up.
const MAX_NODES: usize = 100;

/// Relay's root fields for any object with a global id.
#[derive(Default)]
pub(crate) struct NodeQuery;

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
        Kind::Kit => kits::load(ctx, id).await?.map(Node::Kit),
        Kind::KitReservation => kits::visible(ctx, id).await?.map(Node::KitReservation),
        Kind::WaitlistEntry => waitlists::visible(ctx, id).await?.map(Node::WaitlistEntry),
    })
}
