//! What names a transaction across its repeats, advices and reversals, read
//! the simulators' own way (never with the switch's code: these are the
//! oracles that check it).
//!
//! A reversal (`0420`, `0421` for a repeat) names its original in F90,
//! "original data elements", n42: the original's MTI (4 digits), F11 (6),
//! F7 (10, zeros if it had none), F32 (11, right-justified and zero-filled,
//! zeros if absent) and F33 (11, the same). A peer matches a reversal to
//! what it approved by F90's MTI + F11 + F7, and by the reversal's F41 when
//! it has one: POS terminals number their STANs each on their own.

use crate::iso8583::Message;

/// The digits of F90.
pub const F90_DIGITS: usize = 42;
/// Digits of the institution IDs (F32, F33) inside F90.
const ID_DIGITS: usize = 11;

/// Why a message does not name a transaction.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OriginalError {
    #[error("F{field} is missing")]
    Missing { field: u16 },
    #[error("F{field} does not decode")]
    Unreadable { field: u16 },
    #[error("F{field} is not {digits} digits")]
    NotDigits { field: u16, digits: usize },
    #[error("F{field} has more than {max} digits")]
    TooLong { field: u16, max: usize },
}

/// A transaction as its reversals, repeats and advices name it: its MTI
/// with the repeat bit cleared (`0201` is the `0200` it repeats), F11, F7
/// (zeros when it has none) and its terminal (F41) when it has one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OriginalKey {
    mti: [u8; 4],
    stan: [u8; 6],
    f7: [u8; 10],
    terminal: Option<Vec<u8>>,
}

impl OriginalKey {
    /// The key of `msg` itself (a request, advice or repeat).
    pub fn of_message(msg: &Message<'_>) -> Result<OriginalKey, OriginalError> {
        Ok(OriginalKey {
            mti: first_of_pair(msg.mti().digits()),
            stan: digits(msg, 11)?.ok_or(OriginalError::Missing { field: 11 })?,
            f7: digits(msg, 7)?.unwrap_or([b'0'; 10]),
            terminal: logical(msg, 41)?,
        })
    }

    /// The key of the original a reversal names: F90's MTI, F11 and F7, and
    /// the reversal's own F41.
    pub fn of_reversal(msg: &Message<'_>) -> Result<OriginalKey, OriginalError> {
        let data = OriginalData::of_reversal(msg)?;
        Ok(OriginalKey {
            mti: first_of_pair(data.mti),
            stan: data.stan,
            f7: data.f7,
            terminal: logical(msg, 41)?,
        })
    }

    /// Whether the original is an advice (`0120`, `0220`, a repeat of one).
    pub fn is_advice(&self) -> bool {
        matches!(self.mti[1], b'1' | b'2') && self.mti[2] == b'2'
    }

    /// The same transaction under another MTI: a terminal's reversal
    /// (0400) names its purchase by the purchase's own STAN, F7 and
    /// terminal, so its original is `self.under(*b"0200")`.
    pub fn under(&self, mti: [u8; 4]) -> OriginalKey {
        OriginalKey {
            mti,
            ..self.clone()
        }
    }

    /// `MTI/F11/F7[/F41]`, for logs and test messages.
    pub fn describe(&self) -> String {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let mut out = format!(
            "{}/{}/{}",
            text(&self.mti),
            text(&self.stan),
            text(&self.f7)
        );
        if let Some(t) = &self.terminal {
            out.push('/');
            out.push_str(&text(t));
        }
        out
    }
}

/// F90's five parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OriginalData {
    pub mti: [u8; 4],
    pub stan: [u8; 6],
    pub f7: [u8; 10],
    pub acquirer: [u8; ID_DIGITS],
    pub forwarder: [u8; ID_DIGITS],
}

impl OriginalData {
    /// What a reversal of `original` carries in F90.
    pub fn of_original(original: &Message<'_>) -> Result<OriginalData, OriginalError> {
        Ok(OriginalData {
            mti: original.mti().digits(),
            stan: digits(original, 11)?.ok_or(OriginalError::Missing { field: 11 })?,
            f7: digits(original, 7)?.unwrap_or([b'0'; 10]),
            acquirer: institution(original, 32)?,
            forwarder: institution(original, 33)?,
        })
    }

    /// F90 of `reversal`, read.
    pub fn of_reversal(reversal: &Message<'_>) -> Result<OriginalData, OriginalError> {
        let f90 = logical(reversal, 90)?.ok_or(OriginalError::Missing { field: 90 })?;
        OriginalData::parse(&f90)
    }

    /// The 42 digits of F90, read.
    pub fn parse(f90: &[u8]) -> Result<OriginalData, OriginalError> {
        let not_digits = OriginalError::NotDigits {
            field: 90,
            digits: F90_DIGITS,
        };
        if f90.len() != F90_DIGITS || !f90.iter().all(u8::is_ascii_digit) {
            return Err(not_digits);
        }
        let mut parts = f90;
        let mut take = |n: usize| {
            let (head, rest) = parts.split_at(n);
            parts = rest;
            head
        };
        let copy = |dst: &mut [u8], src: &[u8]| dst.copy_from_slice(src);
        let mut d = OriginalData {
            mti: [0; 4],
            stan: [0; 6],
            f7: [0; 10],
            acquirer: [0; ID_DIGITS],
            forwarder: [0; ID_DIGITS],
        };
        copy(&mut d.mti, take(4));
        copy(&mut d.stan, take(6));
        copy(&mut d.f7, take(10));
        copy(&mut d.acquirer, take(ID_DIGITS));
        copy(&mut d.forwarder, take(ID_DIGITS));
        Ok(d)
    }

    /// The 42 digits, as F90 carries them.
    pub fn to_digits(&self) -> String {
        [
            &self.mti[..],
            &self.stan,
            &self.f7,
            &self.acquirer,
            &self.forwarder,
        ]
        .concat()
        .into_iter()
        .map(char::from)
        .collect()
    }
}

/// The first MTI of a repeat pair: the origin digit's low bit cleared.
fn first_of_pair(mut mti: [u8; 4]) -> [u8; 4] {
    let origin = mti[3] - b'0';
    mti[3] = b'0' + origin - origin % 2;
    mti
}

/// The logical value of field `id`, if present.
fn logical(msg: &Message<'_>, id: u16) -> Result<Option<Vec<u8>>, OriginalError> {
    match msg.field(id) {
        Ok(f) => Ok(f.map(|f| f.logical().collect())),
        Err(_) => Err(OriginalError::Unreadable { field: id }),
    }
}

/// Field `id` as exactly `N` digits, if present.
fn digits<const N: usize>(msg: &Message<'_>, id: u16) -> Result<Option<[u8; N]>, OriginalError> {
    let Some(value) = logical(msg, id)? else {
        return Ok(None);
    };
    let wrong = OriginalError::NotDigits {
        field: id,
        digits: N,
    };
    if !value.iter().all(u8::is_ascii_digit) {
        return Err(wrong);
    }
    value.try_into().map(Some).map_err(|_| wrong)
}

/// An institution ID right-justified in 11 zero-filled digits (zeros when
/// the field is absent).
fn institution(msg: &Message<'_>, id: u16) -> Result<[u8; ID_DIGITS], OriginalError> {
    let mut out = [b'0'; ID_DIGITS];
    let Some(value) = logical(msg, id)? else {
        return Ok(out);
    };
    if value.len() > ID_DIGITS {
        return Err(OriginalError::TooLong {
            field: id,
            max: ID_DIGITS,
        });
    }
    if !value.iter().all(u8::is_ascii_digit) {
        return Err(OriginalError::NotDigits {
            field: id,
            digits: value.len(),
        });
    }
    out[ID_DIGITS - value.len()..].copy_from_slice(&value);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso8583::{Decoded, Mti, Spec, samples};
    use bytes::Bytes;

    fn encoded(spec: &Spec, d: &Decoded) -> Bytes {
        Bytes::from(spec.encode(d).unwrap())
    }

    #[test]
    fn f90_names_the_original_in_42_digits() {
        let spec = Spec::builtin("cups").unwrap();
        let original = Message::parse(&spec, encoded(&spec, &samples::purchase(&spec))).unwrap();
        let data = OriginalData::of_original(&original).unwrap();
        // MTI, STAN, F7, then F32 03105840 and F33 00010000 in 11 digits each.
        let want = ["0200", "123456", "1202145246", "00003105840", "00000010000"].concat();
        assert_eq!(data.to_digits(), want);
        assert_eq!(OriginalData::parse(want.as_bytes()), Ok(data));
    }

    #[test]
    fn a_reversal_matches_its_original_and_a_repeat_its_first() {
        for name in ["cups", "cup-pos", "iso87ascii", "visa-base1"] {
            let spec = Spec::builtin(name).unwrap();
            let purchase = samples::purchase(&spec);
            let original = Message::parse(&spec, encoded(&spec, &purchase)).unwrap();
            let key = OriginalKey::of_message(&original).unwrap();
            let mut reversal = purchase.clone();
            reversal.mti = Mti::new(*b"0421").unwrap();
            let f90 = OriginalData::of_original(&original).unwrap().to_digits();
            reversal.set_text(90, f90);
            let reversal = Message::parse(&spec, encoded(&spec, &reversal)).unwrap();
            assert_eq!(
                OriginalKey::of_reversal(&reversal),
                Ok(key.clone()),
                "{name}"
            );
            let mut repeat = purchase.clone();
            repeat.mti = Mti::new(*b"0201").unwrap();
            let repeat = Message::parse(&spec, encoded(&spec, &repeat)).unwrap();
            assert_eq!(OriginalKey::of_message(&repeat), Ok(key), "{name}");
        }
    }

    #[test]
    fn the_terminal_tells_pos_stans_apart() {
        let spec = Spec::builtin("cup-pos").unwrap();
        let mut d = samples::purchase(&spec);
        let a = Message::parse(&spec, encoded(&spec, &d)).unwrap();
        let a = OriginalKey::of_message(&a).unwrap();
        d.set_text(41, "87654321");
        let b = Message::parse(&spec, encoded(&spec, &d)).unwrap();
        assert_ne!(a, OriginalKey::of_message(&b).unwrap());
        assert_eq!(a.describe(), "0200/123456/0000000000/12345678");
    }

    #[test]
    fn bad_f90s_are_refused() {
        assert!(OriginalData::parse(b"0200").is_err());
        let mut digits = [b'0'; 42];
        assert!(OriginalData::parse(&digits).is_ok());
        digits[7] = b'x';
        assert_eq!(
            OriginalData::parse(&digits),
            Err(OriginalError::NotDigits {
                field: 90,
                digits: 42
            })
        );
        let spec = Spec::builtin("cups").unwrap();
        let no_f90 = Message::parse(&spec, encoded(&spec, &samples::purchase(&spec))).unwrap();
        assert_eq!(
            OriginalKey::of_reversal(&no_f90),
            Err(OriginalError::Missing { field: 90 })
        );
    }
}
