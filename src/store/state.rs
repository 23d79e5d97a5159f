//! What names a SAF entry and where it stands, apart from the entry itself:
//! the store's errors name both.

use std::fmt;

use serde::Serialize;

/// The store's id of an entry; ids are never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SafId(pub i64);

impl fmt::Display for SafId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SafState {
    Pending,
    Delivered,
    Dead,
    Dropped,
}
