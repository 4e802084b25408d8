//! Webhook endpoints (operators) and where they may point.

pub mod egress;
