//! `ISOSWITCH__...` environment overrides: resolved against the file's tree,
//! and named first in any error they cause.

use super::*;

/// One `ISOSWITCH__...` variable, resolved to the key it sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvOverride {
    /// The variable's name, for errors.
    pub var: String,
    /// The key it sets, as errors print keys: `service[0].back.node[1].weight`.
    pub key: String,
    /// The value, always as a string: serde converts it to the key's type, so
    /// `01` stays `"01"` for a string key and is 1 for a number.
    pub value: String,
}

/// Resolves `ISOSWITCH__A__0__B=value` variables against the file's tree.
/// Levels are separated by `__` and lower-cased; a number indexes a list
/// (`SERVICE__0` is the first service), which must exist in the file.
pub fn env_overrides(
    tree: &serde_json::Value,
    vars: impl Iterator<Item = (String, String)>,
) -> Result<Vec<EnvOverride>, ConfigError> {
    let prefix = format!("{ENV_PREFIX}__");
    let mut out = Vec::new();
    for (var, value) in vars {
        let Some(path) = var.strip_prefix(&prefix) else {
            continue;
        };
        let mut key = String::new();
        let mut at = Some(tree);
        for seg in path.split("__").map(str::to_ascii_lowercase) {
            let index = seg.parse::<usize>().ok();
            match (at, index) {
                (Some(serde_json::Value::Array(items)), Some(i)) => {
                    if i >= items.len() {
                        return Err(ConfigError::Env {
                            var,
                            key,
                            reason: Box::new(Reason::PastTheList {
                                index: i,
                                len: items.len(),
                            }),
                        });
                    }
                    key.push_str(&format!("[{i}]"));
                    at = items.get(i);
                }
                (_, Some(_)) => {
                    return Err(ConfigError::Env {
                        var,
                        key,
                        reason: Box::new(Reason::NotAList(seg)),
                    });
                }
                (_, None) if seg.is_empty() => {
                    return Err(invalid(var, "empty level (`___` or a trailing `__`)"));
                }
                (_, None) => {
                    if !key.is_empty() {
                        key.push('.');
                    }
                    key.push_str(&seg);
                    at = at.and_then(|v| v.get(&seg));
                }
            }
        }
        out.push(EnvOverride { var, key, value });
    }
    Ok(out)
}

/// The message of a `config` crate error without the key and origin it
/// appends (serde_path_to_error names the key, and names it right).
pub(super) fn reason(e: &config::ConfigError) -> String {
    match e {
        config::ConfigError::At { error, .. } => reason(error),
        config::ConfigError::Type {
            unexpected,
            expected,
            ..
        } => format!("invalid type: {unexpected}, expected {expected}"),
        other => other.to_string(),
    }
}

/// Moves the `path: ` a nested deserializer put before `reason` onto `key`:
/// `service[0].front` + `allow[0]: bad` = `service[0].front.allow[0]` + `bad`.
pub(super) fn join_path(mut key: String, mut reason: String) -> (String, String) {
    let is_path = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.[]".contains(&b))
    };
    while let Some((head, rest)) = reason.split_once(": ") {
        if !is_path(head) {
            break;
        }
        if head != "." {
            if !head.starts_with('[') && !key.is_empty() {
                key.push('.');
            }
            key.push_str(head);
        }
        reason = rest.to_string();
    }
    (key, reason)
}

/// Blames an error at `key` on the variable that set it (or a table above
/// it), else on the file.
pub(super) fn blame(overrides: &[EnvOverride], key: String, reason: Box<Reason>) -> ConfigError {
    // Only the deserializer's message starts with a path of its own.
    let (key, reason) = match *reason {
        Reason::Parse(text) => {
            let (key, text) = join_path(key, text);
            (key, Box::new(Reason::Parse(text)))
        }
        _ => (key, reason),
    };
    let shown = reason.to_string();
    let covers = |o: &&EnvOverride| {
        let under = |outer: &str, inner: &str| {
            inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        };
        // The key itself or a table inside it, or an unknown key it added.
        under(&o.key, &key)
            || (under(&key, &o.key)
                && o.key
                    .rsplit('.')
                    .next()
                    .is_some_and(|leaf| shown.contains(&format!("`{leaf}`"))))
    };
    match overrides.iter().rev().find(covers) {
        Some(o) => ConfigError::Env {
            var: o.var.clone(),
            key,
            reason,
        },
        None => ConfigError::Invalid { key, reason },
    }
}
