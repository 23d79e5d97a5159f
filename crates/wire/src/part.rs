//! nom building blocks shared by the envelope parsers (TPDU, CUPS / POS / VISA
//! headers).
//!
//! Every envelope part is written once, as a *streaming* nom parser over a
//! fixed-size part: on a short input it reports `Incomplete` with the bytes
//! still needed, never a guess. The whole-frame entry points (`Tpdu::parse`,
//! `CupsHeader::parse`, `EnvelopeSpec::parse`, ...) run the same parser in
//! *complete* mode through [`complete`], where a short input is the typed
//! [`WireError::Truncated`] naming the part, its offset and its size.

use crate::EnvelopeReason;
use nom::IResult;
use nom::Needed;
use nom::bytes::streaming::take;

use super::WireError;

/// What every wire parser returns: the rest of the input and the value, or a
/// [`WireError`] (never nom's untyped errors).
pub type WireResult<'a, T> = IResult<&'a [u8], T, WireError>;

/// Streaming: the next `N` bytes as an array; `Incomplete` when fewer are there.
#[inline]
pub(crate) fn array<const N: usize>(input: &[u8]) -> WireResult<'_, [u8; N]> {
    let (rest, bytes) = take(N)(input)?;
    // `take(N)` returned exactly N bytes; the fallback cannot happen.
    let array = <[u8; N]>::try_from(bytes).map_err(|_| nom::Err::Incomplete(Needed::new(N)))?;
    Ok((rest, array))
}

/// The complete-mode form of a streaming part parser: `Incomplete` becomes
/// [`WireError::Truncated`] for `what` (offset 0, `need` = the part's size,
/// `have` = the bytes given).
#[inline]
pub(crate) fn complete<'a, T>(
    what: &'static str,
    need: usize,
    mut part: impl FnMut(&'a [u8]) -> WireResult<'a, T>,
) -> impl FnMut(&'a [u8]) -> WireResult<'a, T> {
    move |input| match part(input) {
        Err(nom::Err::Incomplete(_)) => Err(nom::Err::Failure(WireError::truncated(
            what,
            0,
            need,
            input.len(),
        ))),
        other => other,
    }
}

/// Runs a streaming part parser on a whole buffer (a frame payload): its value,
/// or its error, with `Incomplete` reported as [`WireError::Truncated`] for
/// `what`. The whole-frame entry points are this.
#[inline]
pub(crate) fn whole<'a, T>(
    what: &'static str,
    need: usize,
    mut part: impl FnMut(&'a [u8]) -> WireResult<'a, T>,
    input: &'a [u8],
) -> Result<T, WireError> {
    match part(input) {
        Ok((_, value)) => Ok(value),
        Err(nom::Err::Error(e) | nom::Err::Failure(e)) => Err(e),
        Err(nom::Err::Incomplete(_)) => Err(WireError::truncated(what, 0, need, input.len())),
    }
}

/// A malformed part: a nom failure (no backtracking: the bytes are wrong
/// whatever follows) that names the field and its offset in the part.
#[inline]
pub(crate) fn bad(
    what: &'static str,
    offset: usize,
    reason: EnvelopeReason,
) -> nom::Err<WireError> {
    nom::Err::Failure(WireError::BadEnvelope {
        what,
        offset,
        reason,
    })
}

/// Test support: a streaming parser checked on its input cut at every point.
#[cfg(test)]
pub(crate) mod split {
    use std::fmt::Debug;

    use nom::Needed;

    use super::WireResult;

    /// Runs `parser` on every prefix of `input` (empty and whole included) and
    /// checks each against the result on the whole input: a prefix gives
    /// `Incomplete` (with a need that does not reach past what the whole
    /// input uses), or exactly the whole input's value and length, or exactly
    /// its error. Never a different value, never an error the whole does not
    /// give. Returns the whole input's result.
    pub(crate) fn check_every_split<T, F>(parser: F, input: &[u8]) -> WireResult<'_, T>
    where
        T: PartialEq + Debug,
        F: Fn(&[u8]) -> WireResult<'_, T>,
    {
        let full = parser(input);
        let used = match &full {
            Ok((rest, _)) => Some(input.len() - rest.len()),
            Err(_) => None,
        };
        for k in 0..=input.len() {
            let got = parser(&input[..k]);
            match (&got, &full) {
                (Err(nom::Err::Incomplete(needed)), _) => {
                    if let Some(used) = used {
                        assert!(k < used, "cut at {k}: Incomplete, yet {used} bytes parse");
                        if let Needed::Size(n) = needed {
                            assert!(k + n.get() <= used, "cut at {k}: asks for {n} more");
                        }
                    }
                }
                (Ok((rest, value)), Ok((_, whole))) => {
                    assert_eq!(value, whole, "cut at {k}: a different value");
                    assert_eq!(Some(k - rest.len()), used, "cut at {k}: a different length");
                }
                (Err(e), Err(whole)) => assert_eq!(e, whole, "cut at {k}: a different error"),
                _ => panic!("cut at {k}: {got:?}, but the whole input gives {full:?}"),
            }
        }
        full
    }
}
