//! A journal row on its way in: fixed-size, made once by the journal's
//! writer (`crate::journal::raw`) and bound straight into the store's
//! insert, with the statements both backends insert it with. No
//! per-field `String`: each text column is a [`Short`], an inline buffer
//! of its column's width (a value longer than that is clipped, as the
//! store clips every text it keeps). The PAN arrives masked: the message
//! path masks it (`crate::journal::row`), and it never leaves it in clear.

use std::fmt;
use std::sync::Arc;

use crate::store::saf::UnixMillis;

/// Inline text of at most `N` bytes, or NULL. Writing past `N` clips on a
/// character boundary; a NUL becomes U+FFFD, as [`crate::store::saf::clip`] does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Short<const N: usize> {
    /// `NULL_LEN`: no value.
    len: u8,
    /// Set once a write did not fit: what follows is dropped.
    full: bool,
    buf: [u8; N],
}

const NULL_LEN: u8 = u8::MAX;

impl<const N: usize> Short<N> {
    pub const NULL: Short<N> = Short {
        len: NULL_LEN,
        full: false,
        buf: [0; N],
    };

    /// An empty (not NULL) text, to write into.
    pub const fn empty() -> Short<N> {
        Short {
            len: 0,
            full: false,
            buf: [0; N],
        }
    }

    /// `text`, clipped to `N` bytes.
    pub fn new(text: &str) -> Short<N> {
        let mut s = Short::empty();
        let _ = fmt::Write::write_str(&mut s, text);
        s
    }

    /// `bytes` when every one is printable ASCII (clipped to `N`); `None`
    /// otherwise, for the caller's careful path.
    pub fn printable(bytes: impl Iterator<Item = u8>) -> Option<Short<N>> {
        let mut s = Short::empty();
        for b in bytes {
            if !(b' '..=b'~').contains(&b) {
                return None;
            }
            if let Some(slot) = s.buf.get_mut(usize::from(s.len)) {
                *slot = b;
                s.len += 1;
            }
        }
        Some(s)
    }

    /// [`Short::printable`] of a slice: the same text, checked and copied
    /// a slice at a time.
    pub fn printable_slice(bytes: &[u8]) -> Option<Short<N>> {
        if !bytes.iter().all(|b| (b' '..=b'~').contains(b)) {
            return None;
        }
        let mut s = Short::empty();
        let n = bytes.len().min(N);
        if let (Some(to), Some(from)) = (s.buf.get_mut(..n), bytes.get(..n)) {
            to.copy_from_slice(from);
            // n <= N < NULL_LEN: the buffers are at most 24 bytes.
            s.len = u8::try_from(n).unwrap_or(0);
        }
        Some(s)
    }

    pub fn opt(text: Option<&str>) -> Short<N> {
        text.map_or(Short::NULL, Short::new)
    }

    pub fn is_null(&self) -> bool {
        self.len == NULL_LEN
    }

    /// The text; `None` for NULL.
    pub fn get(&self) -> Option<&str> {
        if self.is_null() {
            return None;
        }
        // Only whole characters of `&str`s are ever copied in.
        std::str::from_utf8(self.bytes()?).ok()
    }

    /// The text, `""` for NULL (a NOT NULL column).
    pub fn text(&self) -> &str {
        self.get().unwrap_or("")
    }

    /// The text's bytes, `None` for NULL: what the store binds. Always
    /// UTF-8 (only whole characters and printable ASCII are written in),
    /// so it is not checked again for every column of every row: that
    /// check was 1,800 of the store thread's 27,400 instructions a row.
    pub fn bytes(&self) -> Option<&[u8]> {
        if self.is_null() {
            return None;
        }
        self.buf.get(..usize::from(self.len))
    }

    /// [`Short::bytes`], empty for NULL (a NOT NULL column).
    pub fn text_bytes(&self) -> &[u8] {
        self.bytes().unwrap_or_default()
    }
}

impl<const N: usize> Default for Short<N> {
    fn default() -> Self {
        Short::NULL
    }
}

impl<const N: usize> fmt::Write for Short<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.is_null() {
            self.len = 0;
        }
        // Nearly every text (an MTI, a field, a word) fits whole and has no
        // NUL: one copy, not a character at a time.
        let at = usize::from(self.len);
        if !self.full
            && !s.as_bytes().contains(&0)
            && let Some(dst) = self.buf.get_mut(at..at + s.len())
            && at + s.len() < usize::from(NULL_LEN)
        {
            dst.copy_from_slice(s.as_bytes());
            self.len += s.len() as u8;
            return Ok(());
        }
        for c in s.chars() {
            if self.full {
                break;
            }
            let c = if c == '\0' { '\u{FFFD}' } else { c };
            let at = usize::from(self.len);
            let width = c.len_utf8();
            match self.buf.get_mut(at..at + width) {
                Some(dst) if at + width < usize::from(NULL_LEN) => {
                    c.encode_utf8(dst);
                    self.len += width as u8;
                }
                _ => self.full = true,
            }
        }
        Ok(())
    }
}

// Shows the text: only masked values are ever written into one.
impl<const N: usize> fmt::Debug for Short<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}

/// PostgreSQL binds one as text, or NULL.
impl<const N: usize> tokio_postgres::types::ToSql for Short<N> {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.get().to_sql(ty, out)
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <&str as tokio_postgres::types::ToSql>::accepts(ty)
    }

    tokio_postgres::types::to_sql_checked!();
}

/// One exchange to insert: `JournalRow`'s columns (less the id and what
/// a query joins), each text inline.
#[derive(Clone, Debug, Default)]
pub struct NewRow {
    pub t_in: UnixMillis,
    pub t_out: UnixMillis,
    pub service: Option<Arc<str>>,
    pub front: Short<12>,
    pub link: Short<24>,
    pub node: Short<8>,
    pub origin: Short<8>,
    pub mti: Short<8>,
    pub mti_out: Short<8>,
    pub f11: Short<12>,
    pub f7: Short<12>,
    pub f37_in: Short<16>,
    pub f37_out: Short<16>,
    pub f41: Short<16>,
    pub f42: Short<24>,
    pub f32: Short<16>,
    pub f33: Short<16>,
    /// Masked: first 6 and last 4 at most.
    pub pan: Short<24>,
    pub f4: Short<16>,
    pub f49: Short<8>,
    pub f39: Short<8>,
    pub answered_by: Short<8>,
    pub reason: Short<24>,
    pub outcome: Short<12>,
    pub latency_us: Option<i64>,
    pub late: bool,
    pub duplicate: bool,
    pub repeat: bool,
    pub unroutable: bool,
    pub bad: Short<12>,
    pub reversal_id: Option<i64>,
}

impl NewRow {
    pub fn service(&self) -> &str {
        self.service.as_deref().unwrap_or("")
    }
}

/// The columns [`insert_rows`] fills, in [`NewRow`]'s order.
pub const INSERT_COLUMNS: &str = "t_in, t_out, service, front, link, node, origin, \
     mti, mti_out, f11, f7, f37_in, f37_out, f41, f42, f32, f33, pan, f4, f49, f39, \
     answered_by, reason, outcome, latency_us, late, duplicate, repeat, unroutable, bad, \
     reversal_id";

/// Values per row of the insert.
pub const INSERT_ARITY: usize = 31;

/// Rows per insert statement, largest first: a batch goes in as few
/// statements as these sizes allow (each prepared once and cached).
pub const INSERT_CHUNKS: [usize; 3] = [64, 8, 1];

/// One insert of `rows` rows, placeholders `{mark}1`, `{mark}2`, ... (`$`
/// for PostgreSQL, `?` for SQLite).
pub fn insert_rows(rows: usize, mark: char) -> String {
    insert_rows_with(rows, mark, None)
}

/// [`insert_rows`] for SQLite, plus the `part` column, the same value for
/// every row: one more parameter, `?{rows * INSERT_ARITY + 1}`, bound once.
///
/// `OR FAIL`: a refused row stops the statement without undoing the rows
/// it already wrote, so SQLite keeps no statement journal for it. Under
/// the default (`ABORT`) it copied every page each 64-row statement was
/// about to change, to undo that statement alone: 2,113 of the store
/// thread's 27,198 instructions a row (BENCHMARKS.md, "Journal cost").
/// The writer never needs that undo: an insert that fails fails its whole
/// transaction, which is rolled back (`Writer::transact`), and only then
/// are the batch's requests retried one by one.
pub fn insert_rows_in_part(rows: usize) -> String {
    insert_rows_with(rows, '?', Some(rows * INSERT_ARITY + 1))
}

fn insert_rows_with(rows: usize, mark: char, part: Option<usize>) -> String {
    let (verb, extra) = match part {
        Some(_) => ("INSERT OR FAIL", ", part"),
        None => ("INSERT", ""),
    };
    let mut sql = format!("{verb} INTO journal ({INSERT_COLUMNS}{extra}) VALUES ");
    for r in 0..rows {
        if r > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for c in 0..INSERT_ARITY {
            if c > 0 {
                sql.push_str(", ");
            }
            sql.push(mark);
            sql.push_str(&(r * INSERT_ARITY + c + 1).to_string());
        }
        if let Some(p) = part {
            sql.push_str(", ");
            sql.push(mark);
            sql.push_str(&p.to_string());
        }
        sql.push(')');
    }
    sql
}

/// [`insert_rows_in_part`] for each of [`INSERT_CHUNKS`], built once. (A
/// statement cache looks a statement up by its text: building a 64-row
/// insert's text per batch cost more than binding its rows.)
pub fn sqlite_insert_sql(rows: usize) -> &'static str {
    static SQL: std::sync::OnceLock<Vec<(usize, String)>> = std::sync::OnceLock::new();
    let all = SQL.get_or_init(|| {
        INSERT_CHUNKS
            .iter()
            .map(|&n| (n, insert_rows_in_part(n)))
            .collect()
    });
    match all.iter().find(|(n, _)| *n == rows) {
        Some((_, sql)) => sql,
        // Not a chunk size: `chunks` yields none other.
        None => "",
    }
}

/// How `n` rows split into [`INSERT_CHUNKS`]: `(chunk size, count)`.
pub fn chunks(rows: &[NewRow]) -> impl Iterator<Item = &[NewRow]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        let size = INSERT_CHUNKS.into_iter().find(|&c| c <= rest.len())?;
        let (chunk, tail) = rest.split_at(size);
        rest = tail;
        Some(chunk)
    })
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use super::*;

    #[test]
    fn a_short_clips_on_a_char_boundary_and_knows_null() {
        let s: Short<4> = Short::new("abcdef");
        assert_eq!(s.get(), Some("abcd"));
        let s: Short<4> = Short::new("abé€");
        assert_eq!(s.get(), Some("abé"));
        let mut s: Short<8> = Short::NULL;
        assert!(s.is_null() && s.get().is_none());
        let (link, conn) = ("client", 12);
        write!(s, "{link}#{conn}").expect("write");
        assert_eq!(s.get(), Some("client#1"));
        assert_eq!(Short::<4>::new("a\0").get(), Some("a\u{FFFD}"));
        assert_eq!(Short::<3>::new("a\0").get(), Some("a"));
        // Pieces that fit are copied whole; the first that does not is
        // clipped, and nothing is written after it.
        let mut s: Short<4> = Short::empty();
        for piece in ["ab", "cde", "x"] {
            s.write_str(piece).expect("write");
        }
        assert_eq!(s.get(), Some("abcd"));
        let mut s: Short<4> = Short::empty();
        for piece in ["abcd", "x"] {
            s.write_str(piece).expect("write");
        }
        assert_eq!(s.get(), Some("abcd"));
        assert_eq!(
            Short::<4>::printable(b"TERM0001".iter().copied())
                .and_then(|s| s.get().map(str::to_string)),
            Some("TERM".to_string())
        );
        assert!(Short::<8>::printable(b"a\x01".iter().copied()).is_none());
    }

    proptest::proptest! {
        /// The slice path gives what the byte-at-a-time path gives: the
        /// same text, clipped the same, refused for the same bytes.
        #[test]
        fn printable_slice_is_printable(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            let a = Short::<8>::printable(bytes.iter().copied());
            let b = Short::<8>::printable_slice(&bytes);
            proptest::prop_assert_eq!(a.map(|s| s.get().map(str::to_string)), b.map(|s| s.get().map(str::to_string)));
            // Mostly printable input, so the clipping is exercised too.
            let text: Vec<u8> = bytes.iter().map(|b| b' ' + b % 95).collect();
            let a = Short::<8>::printable(text.iter().copied());
            let b = Short::<8>::printable_slice(&text);
            proptest::prop_assert!(a.is_some());
            proptest::prop_assert_eq!(a.map(|s| s.get().map(str::to_string)), b.map(|s| s.get().map(str::to_string)));
        }

        /// The store binds `bytes()` as text unchecked: whatever is
        /// written in, in whatever pieces, they are UTF-8 and the text.
        #[test]
        fn bytes_are_always_the_utf8_text(
            pieces in proptest::collection::vec(".{0,9}", 0..5),
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12),
        ) {
            let mut s: Short<8> = Short::NULL;
            for piece in &pieces {
                s.write_str(piece).expect("write");
            }
            let shorts = [
                s,
                Short::<8>::new(&pieces.concat()),
                Short::<8>::printable_slice(&raw).unwrap_or(Short::NULL),
                Short::<8>::printable(raw.iter().copied()).unwrap_or(Short::NULL),
            ];
            for s in shorts {
                let bytes = s.bytes();
                proptest::prop_assert_eq!(bytes.map(std::str::from_utf8), s.get().map(Ok));
                proptest::prop_assert_eq!(s.text_bytes(), s.text().as_bytes());
            }
        }
    }

    #[test]
    fn a_batch_splits_into_the_cached_insert_sizes() {
        let rows = vec![NewRow::default(); 64 + 8 * 2 + 3];
        let sizes: Vec<usize> = chunks(&rows).map(<[NewRow]>::len).collect();
        assert_eq!(sizes, [64, 8, 8, 1, 1, 1]);
        let sql = insert_rows(2, '?');
        assert!(sql.ends_with("?61, ?62)"), "{sql}");
        assert!(sql.contains("?31), (?32"), "{sql}");
        let sql = insert_rows_in_part(2);
        assert!(sql.contains("reversal_id, part) VALUES"), "{sql}");
        assert!(sql.contains("?31, ?63), (?32"), "{sql}");
        assert!(sql.ends_with("?62, ?63)"), "{sql}");
    }
}
