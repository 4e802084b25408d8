//! The kits' tables: `kits`, their `kit_components`, and the
//! `kit_reservations` whose components are reservations
//! (`reservations.kit_reservation_id`).

pub(crate) mod kit {
    //! The `kits` table.

    use chrono::{DateTime, Utc};
    use sea_orm::entity::prelude::*;

    /// Several inventories sold as one.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "kits")]
    pub(crate) struct Model {
        /// Primary key.
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        /// Unique among kits.
        pub sku: String,
        /// Display name.
        pub name: String,
        /// An inactive kit cannot be reserved; its reservations stay.
        pub active: bool,
        /// When it was made.
        pub created_at: DateTime<Utc>,
    }

    /// No relations are navigated through the ORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub(crate) mod component {
    //! The `kit_components` table: written with its kit, never changed.

    use sea_orm::entity::prelude::*;

    /// Units of one inventory in one kit.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "kit_components")]
    pub(crate) struct Model {
        /// The kit.
        #[sea_orm(primary_key, auto_increment = false)]
        pub kit_id: Uuid,
        /// The inventory.
        #[sea_orm(primary_key, auto_increment = false)]
        pub inventory_id: Uuid,
        /// Units of it in one kit, 1 to 1000.
        pub quantity: i32,
    }

    /// No relations are navigated through the ORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub(crate) mod kit_reservation {
    //! The `kit_reservations` table. Status and expiry are its components'
    //! (always one status, one expiry): kept once, there.

    use chrono::{DateTime, Utc};
    use sea_orm::entity::prelude::*;

    /// A customer's hold on kits.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "kit_reservations")]
    pub(crate) struct Model {
        /// Primary key.
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        /// The kit.
        pub kit_id: Uuid,
        /// The owner.
        pub user_id: String,
        /// Kits held.
        pub quantity: i32,
        /// When it was made.
        pub created_at: DateTime<Utc>,
    }

    /// No relations are navigated through the ORM.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub(crate) use component::Model as ComponentRow;
pub(crate) use kit::Model as KitRow;
pub(crate) use kit_reservation::Model as KitReservationRow;
