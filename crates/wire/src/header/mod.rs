//! The scheme headers that follow the length prefix (and TPDU, if any): one
//! file per header.

// The header files name these through `super::`, as they did beside them.
use crate::{WireError, part, write_ascii_decimal};

pub mod cups;
pub mod pos;
pub mod visa;
