//! `inboxwatch`: parse the command line, run the subcommand, print the error
//! chain, exit with a code (2 for bad configuration or usage, 1 otherwise).

use std::process::ExitCode;

use clap::Parser;
use inboxwatch::cli::{Cli, Command, DeadLetterCommand};
use inboxwatch::config::presets;
use inboxwatch::config::{self, is_table_name};
use inboxwatch::sources::kind::{Action, ActionRequest};
use inboxwatch::sources::table::schema;
use inboxwatch::text::terminal_text;
use inboxwatch::{actions, app, demo, doctor, lookup, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    match cli.command {
        Command::CheckConfig { file, no_env } => match config::load_in(
            &file,
            if no_env {
                config::Environment::Placeholders
            } else {
                config::Environment::Process
            },
        ) {
            Ok(cfg) => {
                println!("config OK: {} sources", cfg.sources.len());
                for used in &cfg.presets {
                    println!();
                    println!("# source \"{}\": {}", used.source, used.headline());
                    println!("# effective settings (name and DSN left out):");
                    print!("{}", used.effective);
                }
                ExitCode::SUCCESS
            }
            Err(e) => config_failure(&e),
        },
        Command::Schema {
            config: Some(path), ..
        } => {
            let cfg = match config::load(&path) {
                Ok(c) => c,
                Err(e) => return config_failure(&e),
            };
            for source in &cfg.sources {
                if let Some(schema) = source.schema() {
                    println!("-- source \"{}\" ({})", source.name(), source.describe());
                    print!("{}", schema.indexes());
                }
                if let Some(ddl) = source.dead_letter_actions().and_then(|a| a.audit_ddl()) {
                    println!(
                        "-- source \"{}\": the audit table of dead-letters replay / ignore",
                        source.name()
                    );
                    print!("{ddl}");
                }
            }
            ExitCode::SUCCESS
        }
        Command::Schema {
            dialect,
            table,
            outbox_table,
            audit_table,
            ..
        } => {
            let Some(dialect) = dialect else {
                eprintln!("--dialect: required (or --config)");
                return ExitCode::from(2);
            };
            for (flag, name) in [
                ("--table", Some(&table)),
                ("--outbox-table", outbox_table.as_ref()),
                ("--audit-table", audit_table.as_ref()),
            ] {
                if let Some(name) = name.filter(|n| !is_table_name(n)) {
                    eprintln!("{flag}: \"{name}\" is not a table name");
                    return ExitCode::from(2);
                }
            }
            print!("{}", schema::ddl(dialect, &table, outbox_table.as_deref()));
            if let Some(audit) = &audit_table {
                println!();
                print!("{}", schema::audit_ddl(dialect, audit));
            }
            ExitCode::SUCCESS
        }
        Command::Metrics => {
            print!("{}", telemetry::catalogue::markdown());
            ExitCode::SUCCESS
        }
        Command::Run {
            config: path,
            listen,
            web_config_file,
        } => {
            let mut cfg = match config::load(&path) {
                Ok(c) => c,
                Err(e) => return config_failure(&e),
            };
            if let Some(l) = listen {
                cfg.listen = l;
            }
            if let Some(file) = web_config_file
                && let Err(e) = cfg.use_web_config_file(file)
            {
                return config_failure(&e);
            }
            finish(runtime().block_on(app::run(cfg)))
        }
        Command::Demo {
            listen,
            rate,
            drill,
            dsn,
        } => {
            let drill = match drill.as_deref() {
                None => None,
                Some("list") => {
                    print!("{}", demo::drill::listing());
                    return ExitCode::SUCCESS;
                }
                Some(name) => match demo::drill::find(name) {
                    Ok(d) => Some(d.drill),
                    Err(e) => {
                        eprintln!("{e}");
                        return ExitCode::from(2);
                    }
                },
            };
            let options = demo::Options {
                listen,
                rate,
                drill,
                dsn,
            };
            finish(runtime().block_on(demo::run(options)))
        }
        Command::Presets { name: None } => {
            print!("{}", presets::listing());
            ExitCode::SUCCESS
        }
        Command::Presets { name: Some(name) } => match presets::find(&name) {
            Some((_, p)) => {
                print!("{}", p.detail());
                ExitCode::SUCCESS
            }
            None => {
                eprintln!(
                    "unknown preset \"{name}\" (expected one of {})",
                    presets::names().join(", ")
                );
                ExitCode::from(2)
            }
        },
        Command::Doctor { config: path } => {
            let cfg = match config::load(&path) {
                Ok(c) => c,
                Err(e) => return config_failure(&e),
            };
            match runtime().block_on(doctor::run(&cfg)) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => finish(Err(e)),
            }
        }
        Command::Trace {
            event_id,
            config: path,
            source,
        } => {
            let cfg = match config::load(&path) {
                Ok(c) => c,
                Err(e) => return config_failure(&e),
            };
            sqlx::any::install_default_drivers();
            lookup_output(runtime().block_on(lookup::trace(&cfg, &event_id, source.as_deref())))
        }
        Command::DeadLetters {
            action: Some(command),
            ..
        } => {
            let (action, args) = match command {
                DeadLetterCommand::Replay(a) => (Action::Replay, a),
                DeadLetterCommand::Ignore(a) => (Action::Ignore, a),
                DeadLetterCommand::History {
                    config: path,
                    source,
                    event_ids,
                } => {
                    let cfg = match config::load(&path) {
                        Ok(c) => c,
                        Err(e) => return config_failure(&e),
                    };
                    sqlx::any::install_default_drivers();
                    return match runtime().block_on(actions::history(&cfg, &source, &event_ids)) {
                        Ok(text) => {
                            print!("{text}");
                            ExitCode::SUCCESS
                        }
                        Err(e) => {
                            eprintln!("error: {}", terminal_text(&e.to_string()));
                            ExitCode::from(e.exit_code())
                        }
                    };
                }
            };
            let cfg = match config::load(&args.config) {
                Ok(c) => c,
                Err(e) => return config_failure(&e),
            };
            sqlx::any::install_default_drivers();
            let request = ActionRequest {
                action,
                operator: args.operator,
                reason: args.reason,
                event_ids: args.event_ids,
                apply: args.yes,
            };
            if !request.apply {
                eprintln!(
                    "dry run: nothing is written; add --yes before the event ids (and their --) to apply"
                );
            }
            match runtime().block_on(actions::run(&cfg, &args.source, &request)) {
                Ok((text, all)) => {
                    print!("{text}");
                    if all {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(e) => {
                    eprintln!("error: {}", terminal_text(&e.to_string()));
                    ExitCode::from(e.exit_code())
                }
            }
        }
        Command::DeadLetters {
            action: None,
            config: path,
            source,
            since,
            limit,
            per_partition,
        } => {
            let Some(path) = path else {
                eprintln!("--config: required");
                return ExitCode::from(2);
            };
            let cfg = match config::load(&path) {
                Ok(c) => c,
                Err(e) => return config_failure(&e),
            };
            sqlx::any::install_default_drivers();
            lookup_output(runtime().block_on(lookup::dead_letters(
                &cfg,
                source.as_deref(),
                since,
                limit,
                per_partition,
            )))
        }
    }
}

fn lookup_output(result: Result<String, lookup::LookupError>) -> ExitCode {
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // An id not found, a driver's error echoing one: as printed text.
            eprintln!("error: {}", terminal_text(&e.to_string()));
            ExitCode::from(e.exit_code())
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the tokio runtime starts")
}

fn config_failure(e: &config::ConfigError) -> ExitCode {
    for p in &e.problems {
        eprintln!("{p}");
    }
    ExitCode::from(2)
}

fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .finish()
        .with(telemetry::agent_spans::AgentSpans::new())
        .init();
}
