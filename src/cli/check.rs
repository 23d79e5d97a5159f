//! `isoswitch check`: validate a config (file and environment overrides), print
//! it as the switch would run it, and warn about limits the host cannot give.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;
use crate::config::descriptors::{DescriptorNeed, open_file_limit};

/// Loads, validates and prints `path`; warnings go to stderr.
pub fn run(path: &Path) -> ExitCode {
    let cfg = match Config::load(path) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("isoswitch: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = check_tls(&cfg) {
        eprintln!("isoswitch: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    // `[store]` as `run` will open it: the URL, TLS (a remote PostgreSQL
    // in clear without store.allow_plaintext, a CA file that cannot be read).
    if let Err(e) = cfg.store.validate(&data_dir_of(&cfg)) {
        eprintln!("isoswitch: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    match toml::to_string_pretty(&cfg.effective()) {
        Ok(text) => println!("{text}"),
        Err(e) => {
            eprintln!("isoswitch: cannot print the config: {e}");
            return ExitCode::FAILURE;
        }
    }
    // `run` raises the soft limit to the hard one: the hard one is the limit
    // it will run under (here, as LimitNOFILE gives it under systemd).
    match open_file_limit() {
        Ok((_soft, hard)) => {
            if let Some(warning) = DescriptorNeed::of(&cfg).warning(hard) {
                eprintln!("warning: {warning}");
            }
        }
        Err(e) => eprintln!("warning: cannot read the open-file limit: {e}"),
    }
    if let Some(warning) = key_beside_data(&cfg) {
        eprintln!("warning: {warning}");
    }
    ExitCode::SUCCESS
}

/// The data directory `run` will use (without `--data-dir`).
fn data_dir_of(cfg: &Config) -> std::path::PathBuf {
    let state_directory = std::env::var(crate::ops::data_dir::STATE_DIRECTORY_ENV).ok();
    crate::ops::data_dir::resolve(None, cfg.data_dir.as_deref(), state_directory.as_deref()).0
}

/// The store's data key in the directory of the data it seals: whoever
/// copies the one gets the other (PCI DSS 3.6.1). Made there by default so
/// that a first `run` needs nothing; production keeps it apart.
fn key_beside_data(cfg: &Config) -> Option<String> {
    let data_dir = data_dir_of(cfg);
    let db = match cfg.store.location(&data_dir).ok()? {
        crate::store::Location::Sqlite(path) => path,
        crate::store::Location::Postgres(_) => return None,
    };
    let key = cfg
        .store
        .key_path(&data_dir)
        .unwrap_or_else(|| data_dir.join(crate::store::seal::DEFAULT_KEY_FILE));
    (key.parent() == db.parent()).then(|| {
        format!(
            "store.key_file: the data key {} lies beside the store it seals ({}); in production keep it apart, as a credential (systemd LoadCredential, a container secret)",
            key.display(),
            db.display()
        )
    })
}

/// Reads every certificate, key and CRL the `tls` tables name, as `run`
/// will (an expired or not yet valid certificate, a key others may read,
/// fail); warns of a certificate or CA with less than 14 days left and of a
/// CRL past its next update.
fn check_tls(cfg: &Config) -> Result<(), crate::config::tls::TlsError> {
    let mut services = Vec::new();
    for (i, svc) in cfg.services.iter().enumerate() {
        services.push((svc.name.as_str(), crate::tls::ServiceTls::load(svc, i)?));
    }
    let admin = match cfg.admin.as_ref().and_then(|a| a.tls.as_ref()) {
        Some(t) => Some(crate::tls::AdminTls {
            side: crate::tls::ServerSide::load(t, crate::config::tls::ADMIN_KEY)?,
            handshakes: Default::default(),
        }),
        None => None,
    };
    let certs = crate::tls::cert_statuses(
        services.iter().map(|(name, tls)| (*name, tls)),
        admin.as_ref(),
    );
    for c in certs.iter().filter(|c| c.expires_in_s < 14 * 86_400) {
        eprintln!(
            "warning: {} ({}): {} expires in {} days",
            c.key,
            c.file,
            c.subject,
            c.expires_in_s.div_euclid(86_400)
        );
    }
    let cas = crate::tls::ca_statuses(
        services.iter().map(|(name, tls)| (*name, tls)),
        admin.as_ref(),
    );
    for c in cas.iter().filter(|c| c.expires_in_s < 14 * 86_400) {
        let when = crate::config::tls::rfc3339(c.not_after);
        if c.expires_in_s < 0 {
            eprintln!(
                "warning: {} ({}): the CA {} expired on {when}: renew it (verifiers other than the switch refuse what it signed)",
                c.key, c.file, c.subject
            );
        } else {
            eprintln!(
                "warning: {} ({}): the CA {} expires in {} days ({when})",
                c.key,
                c.file,
                c.subject,
                c.expires_in_s.div_euclid(86_400)
            );
        }
    }
    let now = crate::config::tls::now_s();
    let crls = services.iter().flat_map(|(_, tls)| tls.crls());
    let admin_crls = admin.iter().flat_map(|a| a.side.crls());
    for crl in crls.chain(admin_crls) {
        if let Some(next) = crl.next_update.filter(|&t| t < now) {
            eprintln!(
                "warning: {} ({}): its next update was due on {}: fetch the CA's current list",
                crl.key,
                crl.file.display(),
                crate::config::tls::rfc3339(next)
            );
        }
    }
    Ok(())
}
