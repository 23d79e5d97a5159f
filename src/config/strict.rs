//! Helpers for tables serde's derive cannot read with full key paths.

use serde::{Serialize, de::DeserializeOwned, de::Error};

/// The keys `T`'s default prints: the keys it knows.
pub fn keys_of<T: Serialize + Default, E: Error>() -> Result<Vec<String>, E> {
    let known = serde_json::to_value(T::default()).map_err(E::custom)?;
    Ok(known
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default())
}

/// Refuses a table key that `T` does not know.
pub fn check_keys<T: Serialize + Default, E: Error>(value: &config::Value) -> Result<(), E> {
    let mut known = keys_of::<T, E>()?;
    known.sort_unstable();
    if let Ok(table) = value.clone().into_table()
        && let Some(unknown) = table.keys().find(|k| !known.contains(k))
    {
        return Err(E::custom(format!(
            "unknown field `{unknown}`, expected one of `{}`",
            known.join("`, `")
        )));
    }
    Ok(())
}

/// Deserializes `value` as `T`, naming the key inside it that is wrong as
/// `path: reason` (joined to the outer key by `join_path`).
pub fn inner<T: DeserializeOwned, E: Error>(value: config::Value) -> Result<T, E> {
    serde_path_to_error::deserialize(value)
        .map_err(|e| E::custom(format!("{}: {}", e.path(), super::reason(e.inner()))))
}
