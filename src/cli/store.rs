//! `isoswitch store`: the store's own upkeep, beside a running switch.
//!
//! `rekey` seals every payload the store keeps again under the key file's
//! first key (src/store/seal.rs): the step of a key rotation between
//! putting a new key first and taking the old one out.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::journal::{JournalCliError, StoreArgs, open_store};
use crate::store::StoreError;

/// Why `isoswitch store rekey` stopped or left payloads behind.
#[derive(Debug, thiserror::Error)]
pub enum RekeyError {
    #[error(transparent)]
    Open(#[from] JournalCliError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0} payloads open under no key of the key file: left as they are (see the log)")]
    Unopenable(u64),
}

#[derive(Debug, Args)]
pub struct StoreCmdArgs {
    #[command(subcommand)]
    pub command: StoreCommand,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Seal every kept payload under the key file's first key (after a
    /// new key was put first); prints what it did as JSON.
    Rekey(StoreArgs),
}

pub fn run(args: StoreCmdArgs) -> ExitCode {
    match args.command {
        StoreCommand::Rekey(at) => super::runtime(async move {
            let store = open_store(&at).await?;
            eprintln!(
                "store rekey: sealing under the first key of {}",
                store.key_file().display()
            );
            let done = store.saf_rekey().await;
            let _ = store.close().await;
            let done = done?;
            println!("{}", serde_json::to_string(&done).unwrap_or_default());
            if done.unopenable > 0 {
                return Err(RekeyError::Unopenable(done.unopenable));
            }
            Ok::<(), RekeyError>(())
        }),
    }
}
