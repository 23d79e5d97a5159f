//! The scheme headers that follow the length prefix (and TPDU, if any), behind
//! one seam.
//!
//! Each header is one file here that implements [`SchemeHeader`]: how it
//! parses (with its reject form, if it has one), the header of a message the
//! switch makes, where its total length and IDs are, and what `decode` shows
//! of it. The registry below lists the headers once; it makes [`HeaderKind`]
//! (the `[envelope] header` of a spec), [`Header`] (a parsed one) and their
//! dispatch, so the rest of the switch asks the kind and never matches on it.
//!
//! A new header is its file, a `mod` line and a line in the registry.

// The header files name these through `super::`, as they did beside them.
use crate::{WireError, part, write_ascii_decimal};

mod describe;
mod fresh;
mod seam;

pub mod cups;
pub mod pos;
pub mod visa;

pub use describe::{Description, Hex, Scalar};
pub use fresh::{Fresh, FreshError, Setting};
pub use seam::{IdFields, Parts, SchemeHeader, TotalTooLong};

use crate::envelope::Rejected;
use crate::part::WireResult;

/// The registry: every scheme header, as `Variant => Type, "spec name"`.
/// It makes [`HeaderKind`], [`Header`] and the dispatch from either to the
/// header's [`SchemeHeader`] implementation (one `match` each, here only).
macro_rules! headers {
    ($($(#[$doc:meta])* $kind:ident => $ty:ty, $name:literal;)*) => {
        /// Which scheme header follows the length prefix (and TPDU, if any).
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize,
        )]
        pub enum HeaderKind {
            #[default]
            #[serde(rename = "none")]
            None,
            $($(#[$doc])* #[serde(rename = $name)] $kind,)*
        }

        /// A parsed scheme header.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Header {
            $($kind($ty),)*
        }

        $(impl From<$ty> for Header {
            fn from(h: $ty) -> Header {
                Header::$kind(h)
            }
        })*

        impl HeaderKind {
            /// Every kind that has a header (all but `None`).
            pub const HEADERS: &'static [HeaderKind] = &[$(HeaderKind::$kind),*];

            /// The kind's name in a spec's `[envelope] header` and in `decode --json`.
            pub const fn name(self) -> &'static str {
                match self {
                    HeaderKind::None => "none",
                    $(HeaderKind::$kind => $name,)*
                }
            }

            /// Bytes of the header of a message that is not a reject.
            #[inline]
            pub const fn header_len(self) -> usize {
                match self {
                    HeaderKind::None => 0,
                    $(HeaderKind::$kind => <$ty as SchemeHeader>::LEN,)*
                }
            }

            /// The part's name in errors (`CUPS header`); `None` has none.
            pub const fn part(self) -> Option<&'static str> {
                match self {
                    HeaderKind::None => None,
                    $(HeaderKind::$kind => Some(<$ty as SchemeHeader>::PART),)*
                }
            }

            /// Where the header keeps the IDs a response swaps, if it has any.
            pub const fn ids(self) -> Option<IdFields> {
                match self {
                    HeaderKind::None => None,
                    $(HeaderKind::$kind => <$ty as SchemeHeader>::IDS,)*
                }
            }

            /// The header at `input` into `header`, and what its reject form
            /// carries into `rejected`, read through `parts` (whole frame or
            /// streaming). On the message path, so always inlined into the
            /// envelope parser, which it fills in place.
            #[inline(always)]
            pub(crate) fn envelope_part<'a, const COMPLETE: bool>(
                self,
                parts: Parts<'a, COMPLETE>,
                input: &'a [u8],
                header: &mut Option<Header>,
                rejected: &mut Option<Rejected>,
            ) -> WireResult<'a, ()> {
                match self {
                    HeaderKind::None => Ok((input, ())),
                    $(HeaderKind::$kind => {
                        let (rest, h) =
                            <$ty as SchemeHeader>::envelope_part(parts, input, rejected)?;
                        *header = Some(Header::$kind(h));
                        Ok((rest, ()))
                    })*
                }
            }

            /// Parses this kind's header at the start of `input` (a whole
            /// buffer: a short one is `Truncated`); `None` for no header.
            pub fn parse(self, input: &[u8]) -> Result<Option<Header>, WireError> {
                match self {
                    HeaderKind::None => Ok(None),
                    $(HeaderKind::$kind => {
                        let h = part::whole(
                            <$ty as SchemeHeader>::PART,
                            <$ty as SchemeHeader>::LEN,
                            <$ty as SchemeHeader>::header,
                            input,
                        )?;
                        Ok(Some(Header::$kind(h)))
                    })*
                }
            }

            /// Swaps the IDs of a header at the start of `buf`, turning a
            /// request's header into its response's (no-op on a short buffer
            /// or a header without IDs).
            #[inline]
            pub fn swap_ids_in(self, buf: &mut [u8]) {
                match self {
                    HeaderKind::None => {}
                    $(HeaderKind::$kind => <$ty as SchemeHeader>::swap_ids_in(buf),)*
                }
            }

            /// Writes `total` (the bytes from the header to the end of the
            /// message) into a header at the start of `buf`, if it has a
            /// total length field.
            #[inline]
            pub fn set_total_length_in(self, buf: &mut [u8], total: usize) -> Result<(), TotalTooLong> {
                match self {
                    HeaderKind::None => Ok(()),
                    $(HeaderKind::$kind => <$ty as SchemeHeader>::set_total_length_in(buf, total),)*
                }
            }

            /// The header of a message the switch makes (echo, sign-on), from
            /// the link's settings; `None` for no header.
            pub fn fresh(self, settings: &Fresh<'_>) -> Result<Option<Header>, FreshError> {
                match self {
                    HeaderKind::None => Ok(None),
                    $(HeaderKind::$kind => Ok(Some(Header::$kind(<$ty as SchemeHeader>::fresh(settings)?))),)*
                }
            }

            /// The header of a typical request (samples, examples); `None`
            /// for no header.
            pub fn sample(self) -> Option<Header> {
                match self {
                    HeaderKind::None => None,
                    $(HeaderKind::$kind => Some(Header::$kind(<$ty as SchemeHeader>::sample())),)*
                }
            }
        }

        impl Header {
            pub fn kind(&self) -> HeaderKind {
                match self {
                    $(Header::$kind(_) => HeaderKind::$kind,)*
                }
            }

            /// The header's bytes, as on the wire.
            pub fn as_bytes(&self) -> &[u8] {
                match self {
                    $(Header::$kind(h) => SchemeHeader::as_bytes(h),)*
                }
            }

            /// What `decode` shows of it; `frame_len` (the payload's length,
            /// when known) lets it say where the header disagrees with it.
            pub fn describe(&self, frame_len: Option<usize>) -> Description {
                match self {
                    $(Header::$kind(h) => SchemeHeader::describe(h, frame_len),)*
                }
            }
        }
    };
}

headers! {
    /// UnionPay inter-institution 46-byte header.
    Cups => cups::CupsHeader, "cups";
    /// UnionPay POS 6-byte BCD application header.
    Pos => pos::PosHeader, "pos";
    /// VISA BASE I 22-byte header.
    Visa => visa::VisaHeader, "visa";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_keep_their_spec_names() {
        for (kind, name) in [
            (HeaderKind::None, "none"),
            (HeaderKind::Cups, "cups"),
            (HeaderKind::Pos, "pos"),
            (HeaderKind::Visa, "visa"),
        ] {
            assert_eq!(kind.name(), name);
            let json = format!("\"{name}\"");
            assert_eq!(serde_json::to_string(&kind).unwrap(), json);
            assert_eq!(serde_json::from_str::<HeaderKind>(&json).unwrap(), kind);
        }
        assert_eq!(HeaderKind::default(), HeaderKind::None);
    }

    /// Every header the registry lists: its sample parses back to itself, its
    /// bytes are its length, two swaps are none, and it describes itself.
    #[test]
    fn every_header_keeps_the_seam() {
        for &kind in HeaderKind::HEADERS {
            let h = kind.sample().unwrap();
            assert_eq!(h.kind(), kind);
            assert_eq!(h.as_bytes().len(), kind.header_len(), "{kind:?}");
            assert_eq!(kind.parse(h.as_bytes()), Ok(Some(h)), "{kind:?}");
            let mut buf = h.as_bytes().to_vec();
            kind.swap_ids_in(&mut buf);
            assert_eq!(buf != h.as_bytes(), kind.ids().is_some(), "{kind:?}");
            kind.swap_ids_in(&mut buf);
            assert_eq!(buf, h.as_bytes());
            let d = h.describe(Some(kind.header_len()));
            assert_eq!(Some(d.title), kind.part());
            assert!(!d.rows.is_empty() && !d.keys.is_empty(), "{kind:?}");
            let fresh = kind.fresh(&Fresh::default()).unwrap().unwrap();
            assert_eq!(fresh.kind(), kind);
            assert!(matches!(
                kind.parse(&h.as_bytes()[..kind.header_len() - 1]),
                Err(WireError::Truncated { .. })
            ));
        }
        assert_eq!(HeaderKind::None.parse(b"0200"), Ok(None));
        assert_eq!(HeaderKind::None.sample(), None);
        assert_eq!(HeaderKind::None.header_len(), 0);
    }
}
