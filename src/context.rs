//! What a resolver takes from its operation's context: the caller, and the
//! parts the composition root put there (the shared state, each feature's
//! service, the request's DataLoaders). Every look-up is checked: a part that
//! is missing is a wiring bug, answered `INTERNAL` with its name in the log,
//! never a panic. Only the GraphQL layer knows async-graphql's `Context`;
//! `auth` and `app` below it do not.

use std::any::{Any, type_name};

use async_graphql::{Context, ErrorExtensions};

use crate::{
    auth::{User, Viewer},
    error::{AppError, GqlResult},
};

/// Checked access to what an operation's context holds.
pub trait Parts<'a> {
    /// The part of type `T`, or `INTERNAL` when the schema was built without it.
    fn part<T: Any + Send + Sync>(&self) -> GqlResult<&'a T>;

    /// The signed-in user, or `UNAUTHENTICATED`.
    fn user(&self) -> GqlResult<&'a User>;

    /// The signed-in operator, or `UNAUTHENTICATED` / `FORBIDDEN`.
    fn operator(&self) -> GqlResult<&'a User>;
}

impl<'a> Parts<'a> for Context<'a> {
    fn part<T: Any + Send + Sync>(&self) -> GqlResult<&'a T> {
        self.data::<T>().map_err(|_| {
            AppError::internal(anyhow::anyhow!("the operation's context has no {}", type_name::<T>())).extend()
        })
    }

    fn user(&self) -> GqlResult<&'a User> {
        let viewer = self.data_opt::<Viewer>().unwrap_or(&Viewer::Anonymous);
        viewer.user().map_err(|err| err.extend())
    }

    fn operator(&self) -> GqlResult<&'a User> {
        let user = self.user()?;
        if user.is_operator() { Ok(user) } else { Err(AppError::Forbidden.extend()) }
    }
}
