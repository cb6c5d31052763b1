//! `inboxwatch`: parse the command line, run the subcommand, print the error
//! chain, exit with a code (2 for bad configuration or usage, 1 otherwise).

use std::fmt::Display;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use inboxwatch::cli::{self, ActionArgs, Cli, Command, DeadLetterCommand};
use inboxwatch::config::{self, Config, ConfigError, Environment, presets};
use inboxwatch::sources::kind::Action;
use inboxwatch::text::terminal_text;
use inboxwatch::{actions, app, demo, doctor, lookup, schema, telemetry};

fn main() -> ExitCode {
    return_freed_memory();
    let cli = Cli::parse();
    init_logging(&cli.log);
    // Every command that connects to a database does it through `sqlx::Any`.
    sqlx::any::install_default_drivers();
    match dispatch(cli.command) {
        Ok(code) | Err(code) => code,
    }
}

/// Keeps glibc's malloc from holding on to what the agent frees. Each poll
/// builds large buffers and drops them (a source's series as text, a
/// broker's listing as JSON, the rows of a read). glibc serves a block over
/// its mmap threshold from a mapping of its own, returned on free, but after
/// the first such block is freed it raises the threshold to that size (up
/// to 32 MB): from then on the buffers come from the heap, which is given
/// back only from its top, so the agent stayed at its peak. Fixed
/// thresholds (glibc's initial 128 KiB) keep large buffers in their own
/// mappings and trim the heap's free top: at 10,000 partitions × 1,000
/// groups, RSS 167 → 97 MB (docs/performance-kafka.md).
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets malloc's parameters; it is called before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
}

/// Runs one command; `Err` is the exit code of a failure already printed.
fn dispatch(command: Command) -> Result<ExitCode, ExitCode> {
    match command {
        Command::CheckConfig { file, no_env } => check_config(&file, no_env),
        Command::Schema {
            config: Some(path), ..
        } => printed(schema::indexes(&load(&path)?)),
        Command::Schema {
            dialect,
            table,
            outbox_table,
            audit_table,
            ..
        } => {
            let (outbox, audit) = (outbox_table.as_deref(), audit_table.as_deref());
            printed(schema::recommended(dialect, &table, outbox, audit).map_err(usage)?)
        }
        Command::Metrics => printed(telemetry::catalogue::markdown()),
        Command::Presets { name } => show_presets(name.as_deref()),
        Command::Run {
            config: path,
            listen,
            web_config_file,
        } => run(&path, listen, web_config_file),
        Command::Demo {
            drill: Some(name), ..
        } if name == "list" => printed(demo::drill::listing()),
        Command::Demo {
            listen,
            rate,
            drill,
            dsn,
        } => {
            let options = demo::Options::new(listen, rate, drill.as_deref(), dsn).map_err(usage)?;
            finished(block_on(demo::run(options)))
        }
        Command::Doctor { config: path } => match block_on(doctor::run(&load(&path)?)) {
            Ok(true) => Ok(ExitCode::SUCCESS),
            Ok(false) => Ok(ExitCode::from(1)),
            Err(e) => finished(Err(e)),
        },
        Command::Trace {
            event_id,
            config: path,
            source,
        } => {
            let cfg = load(&path)?;
            printed(answered(block_on(lookup::trace(
                &cfg,
                &event_id,
                source.as_deref(),
            )))?)
        }
        Command::DeadLetters {
            action: Some(command),
            ..
        } => dead_letter_command(command),
        Command::DeadLetters {
            action: None,
            config: path,
            source,
            since,
            limit,
            per_partition,
        } => {
            let cfg = load(&path.ok_or_else(|| usage("--config: required"))?)?;
            let listing =
                lookup::dead_letters(&cfg, source.as_deref(), since, limit, per_partition);
            printed(answered(block_on(listing))?)
        }
    }
}

/// `check-config`: the file read and checked, with `--no-env` every `${VAR}`
/// taken as set.
fn check_config(file: &Path, no_env: bool) -> Result<ExitCode, ExitCode> {
    let environment = match no_env {
        true => Environment::Placeholders,
        false => Environment::Process,
    };
    let cfg = config::load_in(file, environment).map_err(config_failure)?;
    printed(cli::config_report(&cfg))
}

/// `presets`: the list, or one preset's settings and what it measures.
fn show_presets(name: Option<&str>) -> Result<ExitCode, ExitCode> {
    let Some(name) = name else {
        return printed(presets::listing());
    };
    match presets::find(name) {
        Some((_, p)) => printed(p.detail()),
        None => Err(usage(format!(
            "unknown preset \"{name}\" (expected one of {})",
            presets::names().join(", ")
        ))),
    }
}

/// `run`: the agent on the config file, with the flags that override it.
fn run(
    path: &Path,
    listen: Option<SocketAddr>,
    web_config_file: Option<PathBuf>,
) -> Result<ExitCode, ExitCode> {
    let mut cfg = load(path)?;
    cfg.listen = listen.unwrap_or(cfg.listen);
    if let Some(file) = web_config_file {
        cfg.use_web_config_file(file).map_err(config_failure)?;
    }
    finished(block_on(app::run(cfg)))
}

/// `dead-letters replay | ignore | history`.
fn dead_letter_command(command: DeadLetterCommand) -> Result<ExitCode, ExitCode> {
    let (action, args) = match command {
        DeadLetterCommand::Replay(args) => (Action::Replay, *args),
        DeadLetterCommand::Ignore(args) => (Action::Ignore, *args),
        DeadLetterCommand::Groups {
            config: path,
            source,
            since,
            limit,
        } => {
            let cfg = load(&path)?;
            let groups = lookup::dead_letter_groups(&cfg, source.as_deref(), since, limit);
            return printed(answered(block_on(groups))?);
        }
        DeadLetterCommand::History {
            config: path,
            source,
            event_ids,
        } => {
            let cfg = load(&path)?;
            return printed(answered(block_on(actions::history(
                &cfg, &source, &event_ids,
            )))?);
        }
    };
    act(action, args)
}

/// `dead-letters replay` / `ignore`: exit 1 unless every event was done (or,
/// without `--yes`, would be).
fn act(action: Action, args: ActionArgs) -> Result<ExitCode, ExitCode> {
    let cfg = load(&args.config)?;
    let source = args.source.clone();
    if args.topic.is_some() {
        return topic_replay(action, args, &cfg);
    }
    let selection = args.selection();
    let config_path = args.config.clone();
    if let Some(run_id) = args.resume.clone() {
        let rate = args.rate;
        let request = args.request(action);
        let resume = actions::resume(&cfg, &config_path, &source, &request, &run_id, rate);
        return all_done(answered(block_on(resume))?);
    }
    if selection.is_some() != args.event_ids.is_empty() {
        return Err(usage(
            "give either event ids or a group or filter (--group, --error-class, \
             --event-type, --since, --until) or --resume RUN_ID, not both and not neither",
        ));
    }
    let request = args.request(action);
    if let Some(selection) = selection {
        let bulk = actions::bulk(&cfg, &config_path, &source, &request, &selection);
        return all_done(answered(block_on(bulk))?);
    }
    if !request.apply {
        eprintln!(
            "dry run: nothing is written; add --yes before the event ids (and their --) to apply"
        );
    }
    all_done(answered(block_on(actions::run(&cfg, &source, &request)))?)
}

/// `dead-letters replay --topic`: records of a Kafka dead-letter topic
/// sent back; exit 1 unless every record was.
fn topic_replay(action: Action, args: ActionArgs, cfg: &Config) -> Result<ExitCode, ExitCode> {
    if action != Action::Replay {
        return Err(usage(
            "--topic: dead-letter topic records can be replayed, not ignored",
        ));
    }
    if !args.event_ids.is_empty()
        || args.group.is_some()
        || args.error_class.is_some()
        || args.event_type.is_some()
    {
        return Err(usage(
            "--topic: records are picked by --partition with --from-offset / --to-offset, \
             --header, --since / --until; not by event ids, --group, --error-class or --event-type",
        ));
    }
    let selection = args
        .topic_selection(actions::TOPIC_REPLAY_MAX)
        .expect("--topic is given");
    let (source, config_path, rate) = (
        args.source.clone(),
        args.config.clone(),
        args.rate.unwrap_or(cli::DEFAULT_RATE),
    );
    let request = args.request(action);
    let run = actions::topic_replay(cfg, &config_path, &source, &request, &selection, rate);
    all_done(answered(block_on(run))?)
}

/// A dead-letter action's output on stdout: exit 0 when every event (or
/// record) was done, or, without `--yes`, would be; else 1.
fn all_done((text, all): (String, bool)) -> Result<ExitCode, ExitCode> {
    print!("{text}");
    Ok(if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The config file at `path`, or exit 2 after one line per problem.
fn load(path: &Path) -> Result<Config, ExitCode> {
    config::load(path).map_err(config_failure)
}

fn config_failure(e: ConfigError) -> ExitCode {
    for p in &e.problems {
        eprintln!("{p}");
    }
    ExitCode::from(2)
}

/// Bad usage: the message as it is, exit 2.
fn usage(message: impl Display) -> ExitCode {
    eprintln!("{message}");
    ExitCode::from(2)
}

/// A command's whole output on stdout: exit 0.
fn printed(text: impl Display) -> Result<ExitCode, ExitCode> {
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// The errors of the lookups and the dead-letter actions, which say their
/// own exit code.
trait CommandFailure: Display {
    fn code(&self) -> u8;
}

impl CommandFailure for lookup::LookupError {
    fn code(&self) -> u8 {
        self.exit_code()
    }
}

impl CommandFailure for actions::CommandError {
    fn code(&self) -> u8 {
        self.exit_code()
    }
}

/// A lookup's or an action's answer; its error printed as text a terminal
/// shows as it is (an id not found, a driver's error echoing one).
fn answered<T>(result: Result<T, impl CommandFailure>) -> Result<T, ExitCode> {
    result.map_err(|e| {
        eprintln!("error: {}", terminal_text(&e.to_string()));
        ExitCode::from(e.code())
    })
}

/// How a long-running command ended: exit 1 after the error chain.
fn finished(result: anyhow::Result<()>) -> Result<ExitCode, ExitCode> {
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {e:#}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// Runs `work` to its end on a runtime of its own.
fn block_on<F: Future>(work: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the tokio runtime starts")
        .block_on(work)
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
