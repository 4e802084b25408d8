//! What a resolver takes from its operation's context: the caller, and the
//! parts the composition root put there (the shared state, each feature's
//! service, the request's DataLoaders). Every look-up is checked: a part that
//! is missing is a wiring bug, answered `INTERNAL` with its name in the log,
//! never a panic. Only the GraphQL layer knows async-graphql's `Context`;
//! `auth` and `app` below it do not.

use std::{
    any::{Any, type_name},
    sync::{Arc, Mutex, PoisonError},
};

use async_graphql::{Context, ErrorExtensions, dataloader::DataLoader};
use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;

use crate::{
    auth::{User, Viewer},
    error::{AppError, GqlResult},
};

/// Checked access to what an operation's context holds.
pub(crate) trait Parts<'a> {
    /// The part of type `T`, or `INTERNAL` when the schema was built without it.
    fn part<T: Any + Send + Sync>(&self) -> GqlResult<&'a T>;

    /// The request's DataLoader of `L` (see [`Loaders`]).
    fn loader<L: FromPool>(&self) -> GqlResult<Arc<DataLoader<L>>>;

    /// The signed-in user, or `UNAUTHENTICATED`.
    fn user(&self) -> GqlResult<&'a User>;

    /// The signed-in operator, or `UNAUTHENTICATED` / `FORBIDDEN`.
    fn operator(&self) -> GqlResult<&'a User>;

    /// The instant the request is answered as of (see [`AsOf`]).
    fn as_of(&self) -> GqlResult<DateTime<Utc>>;
}

impl<'a> Parts<'a> for Context<'a> {
    fn part<T: Any + Send + Sync>(&self) -> GqlResult<&'a T> {
        self.data::<T>().map_err(|_| {
            AppError::internal(anyhow::anyhow!("the operation's context has no {}", type_name::<T>())).extend()
        })
    }

    fn loader<L: FromPool>(&self) -> GqlResult<Arc<DataLoader<L>>> {
        Ok(self.part::<Loaders>()?.get())
    }

    fn user(&self) -> GqlResult<&'a User> {
        let viewer = self.data_opt::<Viewer>().unwrap_or(&Viewer::Anonymous);
        viewer.user().map_err(|err| err.extend())
    }

    fn operator(&self) -> GqlResult<&'a User> {
        let user = self.user()?;
        if user.is_operator() { Ok(user) } else { Err(AppError::Forbidden.extend()) }
    }

    fn as_of(&self) -> GqlResult<DateTime<Utc>> {
        Ok(self.part::<AsOf>()?.0)
    }
}

/// The one instant a request's answer is judged at where the clock
/// decides what it shows (an ACTIVE reservation past its expiry reads as
/// EXPIRED): taken once per request, so a kit reservation whose expiry
/// passes while its fields resolve never shows some components ACTIVE and
/// the rest EXPIRED in one answer, as each field asking the clock did.
pub(crate) struct AsOf(pub(crate) DateTime<Utc>);

// Here, not in `auth`: `auth` stays below `error` (which counts database
// failures through `telemetry`, which labels a span by the caller's role).
impl Viewer {
    /// The signed-in user, or `UNAUTHENTICATED` with the reason.
    pub(crate) fn user(&self) -> Result<&User, AppError> {
        match self {
            Self::User(user) => Ok(user),
            Self::Invalid(reason) => Err(AppError::Unauthenticated(reason)),
            Self::Anonymous => Err(AppError::Unauthenticated("this operation needs a bearer token")),
        }
    }
}

/// A DataLoader's loader, made on the pool its batches run on.
pub(crate) trait FromPool: Send + Sync + 'static {
    /// The loader reading through `db`.
    fn from_pool(db: DatabaseConnection) -> Self;
}

/// Declares a loader that holds nothing but the pool its batch statements
/// run on (every loader so far), made by [`FromPool`]; its `Loader` impl
/// reads through `self.db`.
macro_rules! pool_loader {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub(crate) struct $name {
            db: sea_orm::DatabaseConnection,
        }

        impl $crate::context::FromPool for $name {
            fn from_pool(db: sea_orm::DatabaseConnection) -> Self {
                Self { db }
            }
        }
    };
}
pub(crate) use pool_loader;

/// A request's DataLoaders, each made the first time one of its resolvers
/// asks for it. Made up front, the nine of them (and their places in the
/// request's data) were allocated for every operation, most of which use
/// one or none: 1.6 % of the server's CPU under `bench load reserve`.
pub(crate) struct Loaders {
    /// The pool every loader reads through.
    db: DatabaseConnection,
    /// The loaders made so far, at most one of each type.
    made: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

impl Loaders {
    /// No loader yet; each will read through `db`.
    pub(crate) fn new(db: DatabaseConnection) -> Self {
        Self { db, made: Mutex::new(Vec::new()) }
    }

    /// The DataLoader of `L`, made now if no resolver of this request has
    /// asked for it before: every resolver of the request shares it, so its
    /// keys go out in one batch.
    fn get<L: FromPool>(&self) -> Arc<DataLoader<L>> {
        // Nothing runs while the lock is held that could panic and leave the
        // list half changed.
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        // Only the one of type `L` is cloned (an atomic increment), not every one looked at.
        let mut of_type = made.iter().filter(|made| made.is::<DataLoader<L>>());
        if let Some(loader) = of_type.find_map(|made| Arc::clone(made).downcast().ok()) {
            return loader;
        }
        let loader = Arc::new(DataLoader::new(L::from_pool(self.db.clone()), tokio::spawn));
        made.push(loader.clone());
        loader
    }
}
