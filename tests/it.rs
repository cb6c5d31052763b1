//! The integration tests, as one test binary: each file of `tests/` is one suite,
//! a module of this crate (`postgres::…`, `kafka::…`), so the harness in
//! `common/` is compiled once and the dependencies are linked once, instead of
//! once per file (docs/testing.md, "CI"). Run one suite with
//! `./scripts/test.sh postgres::`.

mod common;
/// A tansu broker and rdkafka clients, for the Kafka suites.
#[path = "common/kafka.rs"]
mod kafka_support;

mod actions;
mod alerting;
mod backlog_growth;
mod cli;
mod config_effects;
mod coordination;
mod counting;
mod dashboards;
mod degraded;
mod demo;
mod deploy;
mod docs;
mod doctor;
mod drills;
mod e2e_alerting;
mod harness;
mod http;
mod image;
mod in_flight;
mod kafka;
mod kafka_cluster;
mod kafka_dead_letters;
mod kafka_fake;
mod kafka_groups;
mod kafka_replay;
mod kafka_shards;
mod layers;
mod libraries;
mod listener;
mod lookup;
mod lossless;
mod mariadb;
mod nats;
mod ordering;
mod pages;
mod postgres;
mod preset_apalis;
mod preset_pgboss;
mod preset_python;
mod preset_recipes;
mod rabbitmq;
mod redaction;
mod redis_streams;
mod reliability;
mod secrets;
mod server_limits;
mod shapes;
mod sqlite;
mod tracing;
mod unmapped_columns;
