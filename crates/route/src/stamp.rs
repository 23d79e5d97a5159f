//! The F37 node stamp: a node's id written into a fixed window of F37
//! (retrieval reference number, an12) so a response can be routed back to
//! that node by any switch instance, with no table.
//!
//! The id is written right-aligned and zero-padded: width 3, node `"7"` →
//! `"007"`. Ids are checked against the window at config time
//! ([`F37Stamp::validate`]): each fits, uses only characters F37 allows (ASCII
//! letters and digits, as an12 has it), and no two ids pad to the same stamp
//! (`"1"` and `"01"` would).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::node::NodeId;

/// Length of F37.
pub const F37_LEN: usize = 12;

/// Where in F37 the node id goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct F37Stamp {
    /// First byte of the window, 0-based.
    pub offset: usize,
    /// Bytes in the window.
    pub width: usize,
}

/// What is wrong with a stamp, its ids or a field.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum StampError {
    #[error(
        "f37 stamp window (offset {offset}, width {width}) must have width >= 1 and fit in 12 bytes"
    )]
    Window { offset: usize, width: usize },
    #[error("node id `{id}` is longer than the f37 stamp width {width}")]
    IdTooWide { id: NodeId, width: usize },
    #[error("node id `{id}` has characters F37 (an) does not allow: use letters and digits")]
    IdNotAlphanumeric { id: NodeId },
    #[error("node ids `{a}` and `{b}` give the same f37 stamp")]
    Collision { a: NodeId, b: NodeId },
    #[error("f37 is {len} bytes; the stamp window needs {need}")]
    FieldTooShort { len: usize, need: usize },
    #[error("no node with index {0} in the stamp table")]
    UnknownNode(usize),
    #[error("request has no F37 to stamp")]
    NoF37,
    #[error("f37 stamp: {0}")]
    Patch(#[from] isoswitch_wire::PatchOverflow),
}

impl F37Stamp {
    fn end(&self) -> Result<usize, StampError> {
        let end = self.offset.checked_add(self.width);
        match end {
            Some(end) if self.width >= 1 && end <= F37_LEN => Ok(end),
            _ => Err(StampError::Window {
                offset: self.offset,
                width: self.width,
            }),
        }
    }

    fn check_id(&self, id: &NodeId) -> Result<(), StampError> {
        if id.len() > self.width {
            return Err(StampError::IdTooWide {
                id: *id,
                width: self.width,
            });
        }
        if !id.as_bytes().iter().all(u8::is_ascii_alphanumeric) {
            return Err(StampError::IdNotAlphanumeric { id: *id });
        }
        Ok(())
    }

    /// The window as `node` fills it (`width` bytes at the front).
    fn padded(&self, id: &NodeId) -> [u8; F37_LEN] {
        let mut w = [b'0'; F37_LEN];
        let width = self.width.min(F37_LEN);
        let id = id.as_bytes();
        let n = id.len().min(width);
        w[width - n..width].copy_from_slice(&id[id.len() - n..]);
        w
    }

    /// Checks the window and every node id of the pool (config time).
    pub fn validate(&self, ids: &[NodeId]) -> Result<(), StampError> {
        self.end()?;
        for (i, id) in ids.iter().enumerate() {
            self.check_id(id)?;
            let mine = self.padded(id);
            if let Some(other) = ids[..i].iter().find(|o| self.padded(o) == mine) {
                return Err(StampError::Collision { a: *other, b: *id });
            }
        }
        Ok(())
    }

    /// Writes `node`'s id into the window of `f37`, right-aligned and
    /// zero-padded. Leaves `f37` untouched on error.
    pub fn stamp(&self, f37: &mut [u8], node: &NodeId) -> Result<(), StampError> {
        let end = self.end()?;
        self.check_id(node)?;
        let len = f37.len();
        let window = f37
            .get_mut(self.offset..end)
            .ok_or(StampError::FieldTooShort { len, need: end })?;
        window.copy_from_slice(&self.padded(node)[..self.width]);
        Ok(())
    }

    /// The window's bytes in `f37`, if it is long enough.
    pub fn read<'a>(&self, f37: &'a [u8]) -> Option<&'a [u8]> {
        let end = self.end().ok()?;
        f37.get(self.offset..end)
    }
}

/// A pool's stamps, checked once: stamp by node index, and find the node
/// index a stamped F37 names.
#[derive(Clone, Debug)]
pub struct StampTable {
    stamp: F37Stamp,
    /// `windows[i][..width]` is node `i`'s stamp.
    windows: Vec<[u8; F37_LEN]>,
}

impl StampTable {
    /// Validates `stamp` against `ids` (`ids[i]` is node `i`).
    pub fn new(stamp: F37Stamp, ids: &[NodeId]) -> Result<Self, StampError> {
        stamp.validate(ids)?;
        Ok(Self {
            stamp,
            windows: ids.iter().map(|id| stamp.padded(id)).collect(),
        })
    }

    pub fn stamp_config(&self) -> F37Stamp {
        self.stamp
    }

    /// Writes node `index`'s stamp into `f37`.
    pub fn stamp(&self, f37: &mut [u8], index: usize) -> Result<(), StampError> {
        let w = self
            .windows
            .get(index)
            .ok_or(StampError::UnknownNode(index))?;
        let end = self.stamp.offset + self.stamp.width; // validated in new
        let len = f37.len();
        let window = f37
            .get_mut(self.stamp.offset..end)
            .ok_or(StampError::FieldTooShort { len, need: end })?;
        window.copy_from_slice(&w[..self.stamp.width]);
        Ok(())
    }

    /// The node whose stamp `f37` carries, if any.
    pub fn node_of(&self, f37: &[u8]) -> Option<usize> {
        let got = self.stamp.read(f37)?;
        self.windows
            .iter()
            .position(|w| &w[..self.stamp.width] == got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<NodeId> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    const S: F37Stamp = F37Stamp {
        offset: 0,
        width: 3,
    };

    #[test]
    fn validate_checks_window_and_ids() {
        assert_eq!(S.validate(&ids(&["1", "02", "A3"])), Ok(()));
        assert_eq!(S.validate(&[]), Ok(()));
        let w = F37Stamp {
            offset: 10,
            width: 3,
        };
        assert_eq!(
            w.validate(&[]),
            Err(StampError::Window {
                offset: 10,
                width: 3
            })
        );
        let w = F37Stamp {
            offset: 0,
            width: 0,
        };
        assert!(matches!(w.validate(&[]), Err(StampError::Window { .. })));
        let w = F37Stamp {
            offset: usize::MAX,
            width: 2,
        };
        assert!(matches!(w.validate(&[]), Err(StampError::Window { .. })));
        assert!(
            F37Stamp {
                offset: 10,
                width: 2
            }
            .validate(&ids(&["99"]))
            .is_ok()
        );
        assert!(matches!(
            S.validate(&ids(&["1234"])),
            Err(StampError::IdTooWide { width: 3, .. })
        ));
        assert!(matches!(
            S.validate(&ids(&["a-1"])),
            Err(StampError::IdNotAlphanumeric { .. })
        ));
        let e = S.validate(&ids(&["1", "02", "001"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node ids `1` and `001` give the same f37 stamp"
        );
    }

    #[test]
    fn stamp_and_read() {
        let mut f37 = *b"123456789012";
        S.stamp(&mut f37, &"7".parse().unwrap()).unwrap();
        assert_eq!(&f37, b"007456789012");
        let mid = F37Stamp {
            offset: 8,
            width: 4,
        };
        mid.stamp(&mut f37, &"AB1".parse().unwrap()).unwrap();
        assert_eq!(&f37, b"007456780AB1");
        assert_eq!(mid.read(&f37), Some(&b"0AB1"[..]));
        assert_eq!(S.read(&f37), Some(&b"007"[..]));
        assert_eq!(mid.read(b"short"), None);
        // Errors leave the field untouched.
        let before = f37;
        assert!(matches!(
            S.stamp(&mut f37, &"1234".parse().unwrap()),
            Err(StampError::IdTooWide { .. })
        ));
        assert_eq!(
            mid.stamp(&mut f37[..10], &"1".parse().unwrap()),
            Err(StampError::FieldTooShort { len: 10, need: 12 })
        );
        assert!(matches!(
            S.stamp(&mut f37, &"a_".parse().unwrap()),
            Err(StampError::IdNotAlphanumeric { .. })
        ));
        assert_eq!(f37, before);
    }

    #[test]
    fn table_round_trips_every_node() {
        let list = ids(&["1", "02", "Z9", "100"]);
        let t = StampTable::new(S, &list).unwrap();
        for (i, id) in list.iter().enumerate() {
            let mut f37 = *b"000000123456";
            t.stamp(&mut f37, i).unwrap();
            assert_eq!(t.node_of(&f37), Some(i));
            // Same bytes as stamping by id.
            let mut by_id = *b"000000123456";
            S.stamp(&mut by_id, id).unwrap();
            assert_eq!(f37, by_id);
        }
        assert_eq!(t.node_of(b"999000123456"), None);
        assert_eq!(t.node_of(b"00"), None);
        assert_eq!(t.stamp(&mut [0u8; 12], 9), Err(StampError::UnknownNode(9)));
        assert!(matches!(
            t.stamp(&mut [0u8; 2], 0),
            Err(StampError::FieldTooShort { .. })
        ));
        assert!(StampTable::new(S, &ids(&["1", "01"])).is_err());
    }

    #[test]
    fn config_parses() {
        let s: F37Stamp = toml::from_str("offset = 10\nwidth = 2").unwrap();
        assert_eq!(
            s,
            F37Stamp {
                offset: 10,
                width: 2
            }
        );
        assert!(toml::from_str::<F37Stamp>("offset = 1").is_err());
    }
}
