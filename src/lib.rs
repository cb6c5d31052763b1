//! inboxwatch: an agent that watches message consumers from the outside —
//! their inbox / processing-record tables and outbox tables — and exports
//! what on-call needs as Prometheus metrics.

pub mod actions;
pub mod app;
pub mod card;
pub mod cli;
pub mod config;
pub mod coordination;
pub mod demo;
pub mod doctor;
pub mod dsn;
pub mod fingerprint;
pub mod health;
pub mod http;
pub mod journal;
pub mod lookup;
pub mod redact;
pub mod schema;
pub mod sources;
pub mod telemetry;
pub mod text;
pub mod tracing_link;
pub mod validation;
