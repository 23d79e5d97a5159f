//! `isoswitch journal`: the exchanges and admin actions the switch
//! recorded, read from its store (docs/journal.md), and `isoswitch journal
//! report`: the day's reconciliation table.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use clap::{Args, Subcommand};

use crate::config::ConfigError;
use crate::journal::chart::ChartError;
use crate::journal::params::{self, DEFAULT_LIMIT, MAX_LIMIT, TimeError};
use crate::journal::report as show;
use crate::store::journal::{JournalFilter, OutcomeFilter};
use crate::store::{Store, StoreConfig, StoreError};

/// Why `isoswitch journal` (or the store it opens for `isoswitch store`)
/// stopped; each variant names the flag or the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum JournalCliError {
    #[error("--{flag}: {source}")]
    Time {
        flag: &'static str,
        #[source]
        source: TimeError,
    },
    #[error("--limit: within 1..={MAX_LIMIT}")]
    Limit,
    #[error("--day: {0}")]
    Day(#[source] TimeError),
    #[error("{}: {source}", .path.display())]
    Config {
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
    #[error("no store at {} (give --data-dir, --store-url or --config)", .0.display())]
    NoStore(PathBuf),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Chart(#[from] ChartError),
    #[error("--svg {}: {source}", .path.display())]
    Svg {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct JournalArgs {
    #[command(subcommand)]
    pub command: Option<JournalCommand>,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Print JSON (an array of rows).
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV, every column.
    #[arg(long)]
    pub csv: bool,
    /// Show the admin actions (and refused tokens) instead of exchanges.
    #[arg(long)]
    pub admin: bool,
}

#[derive(Debug, Subcommand)]
pub enum JournalCommand {
    /// Per service and node: exchanges by outcome, switch-made answers by
    /// reason, late approvals and their reversals, p50/p99 latency.
    Report {
        #[command(flatten)]
        store: StoreArgs,
        /// The day, YYYY-MM-DD (UTC); today by default.
        #[arg(long)]
        day: Option<String>,
        #[arg(long)]
        json: bool,
        /// Also draw the day's exchanges by outcome and hour into FILE (SVG).
        #[arg(long, value_name = "FILE")]
        svg: Option<std::path::PathBuf>,
    },
}

/// Where the store is, as `run` finds it.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The switch's data directory (its SQLite store). Default: the
    /// config's `data_dir`, else $STATE_DIRECTORY, else ./isoswitch-data.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// A store URL (`postgres://...`, `sqlite:/path.db`), as `store.url`.
    #[arg(long, value_name = "URL", env = "ISOSWITCH_STORE_URL")]
    pub store_url: Option<String>,
    /// The switch's config file, for its `data_dir` and `[store]`.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct FilterArgs {
    /// From this time: 2026-12-04T10:00:00Z, 2026-12-04, Unix ms, or 2h (ago).
    #[arg(long)]
    pub since: Option<String>,
    /// Before this time (same forms).
    #[arg(long)]
    pub until: Option<String>,
    /// F37 as received or as answered.
    #[arg(long)]
    pub rrn: Option<String>,
    /// F11.
    #[arg(long)]
    pub stan: Option<String>,
    /// F41.
    #[arg(long)]
    pub terminal: Option<String>,
    #[arg(long)]
    pub node: Option<String>,
    #[arg(long)]
    pub service: Option<String>,
    /// switch-made, late, reversed, bad, duplicate, unroutable or repeat.
    #[arg(long, value_parser = |s: &str| s.parse::<OutcomeFilter>())]
    pub outcome: Option<OutcomeFilter>,
    /// Most rows printed: 1000 by default, at most 100000 (narrow the
    /// query with --since/--until for more).
    #[arg(long, default_value_t = DEFAULT_LIMIT)]
    pub limit: usize,
    /// Newest first.
    #[arg(long)]
    pub newest_first: bool,
}

impl FilterArgs {
    fn filter(&self, now: SystemTime) -> Result<JournalFilter, JournalCliError> {
        let time = |flag: &'static str, v: &Option<String>| {
            v.as_deref()
                .map(|t| {
                    params::parse_time(t, now)
                        .map_err(|source| JournalCliError::Time { flag, source })
                })
                .transpose()
        };
        if !(1..=MAX_LIMIT).contains(&self.limit) {
            return Err(JournalCliError::Limit);
        }
        Ok(JournalFilter {
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
            rrn: self.rrn.clone(),
            stan: self.stan.clone(),
            terminal: self.terminal.clone(),
            node: self.node.clone(),
            service: self.service.clone(),
            outcome: self.outcome,
            limit: self.limit,
            newest_first: self.newest_first,
        })
    }
}

pub fn run(args: JournalArgs) -> ExitCode {
    super::runtime(async move {
        match &args.command {
            Some(JournalCommand::Report {
                store,
                day,
                json,
                svg,
            }) => {
                let (since, until) = params::day_bounds(day.as_deref(), SystemTime::now())
                    .map_err(JournalCliError::Day)?;
                let store = open_store(store).await?;
                let report = store.journal_report(since, until).await?;
                if *json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    print!("{}", show::report_table(&report));
                }
                if let Some(path) = svg {
                    let title = day.clone().unwrap_or_else(|| "today (UTC)".to_string());
                    let drawn = crate::journal::chart::outcomes_svg(&report, &title)?;
                    std::fs::write(path, drawn).map_err(|source| JournalCliError::Svg {
                        path: path.clone(),
                        source,
                    })?;
                }
                close(store).await;
                Ok(())
            }
            None => list(&args).await,
        }
    })
}

async fn list(args: &JournalArgs) -> Result<(), JournalCliError> {
    let filter = args.filter.filter(SystemTime::now())?;
    let store = open_store(&args.store).await?;
    let printed = if args.admin {
        let rows = store.admin_query(filter.since, filter.limit).await?;
        if args.json {
            serde_json::to_string_pretty(&rows)? + "\n"
        } else {
            show::admin_table(&rows)
        }
    } else {
        let rows = store.journal_query(filter).await?;
        if args.json {
            serde_json::to_string_pretty(&rows)? + "\n"
        } else if args.csv {
            show::csv(&rows)
        } else {
            show::table(&rows)
        }
    };
    print!("{printed}");
    close(store).await;
    Ok(())
}

/// Opens the store the flags name; a SQLite store that is not there is an
/// error (a query never creates one).
pub(super) async fn open_store(args: &StoreArgs) -> Result<Store, JournalCliError> {
    let loaded =
        match &args.config {
            Some(path) => Some(crate::config::Config::load(path).map_err(|source| {
                JournalCliError::Config {
                    path: path.clone(),
                    source,
                }
            })?),
            None => None,
        };
    let mut cfg = loaded
        .as_ref()
        .map(|c| c.store.clone())
        .unwrap_or_else(StoreConfig::default);
    if args.store_url.is_some() {
        cfg.url = args.store_url.clone();
    }
    let state_directory = std::env::var(crate::ops::data_dir::STATE_DIRECTORY_ENV).ok();
    let (data_dir, _) = crate::ops::data_dir::resolve(
        args.data_dir.as_deref(),
        loaded.as_ref().and_then(|c| c.data_dir.as_deref()),
        state_directory.as_deref(),
    );
    if let crate::store::Location::Sqlite(path) = cfg.location(&data_dir)?
        && !path.exists()
    {
        return Err(JournalCliError::NoStore(path));
    }
    Ok(Store::open(&cfg, &data_dir).await?)
}

async fn close(store: Store) {
    let _ = store.close().await;
}
