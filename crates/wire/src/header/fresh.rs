//! The settings the header of a switch-made message is built from
//! ([`Fresh`]), and what is wrong with one that cannot be used.

/// The link's settings for the header of a message the switch makes (the
/// `[service.network]` table, or the front's IDs); `None` takes the header's
/// default. Each header reads what it has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fresh<'a> {
    pub destination_id: Option<&'a str>,
    pub source_id: Option<&'a str>,
    /// The whole header as hex, for a header the switch copies rather than
    /// fills in (POS).
    pub header_hex: Option<&'a str>,
}

/// Which setting a [`FreshError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    DestinationId,
    SourceId,
    HeaderHex,
}

/// A setting a fresh header cannot be built from: its value, and what the
/// header needs there (stated by the header's own file).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting:?}: `{value}` is not {needs}")]
pub struct FreshError {
    pub setting: Setting,
    /// The value as configured (IDs and header bytes, never card data).
    pub value: String,
    /// What the header needs, e.g. "a VISA station ID (6 digits)".
    pub needs: &'static str,
}

impl FreshError {
    pub(crate) fn new(setting: Setting, value: &str, needs: &'static str) -> Self {
        FreshError {
            setting,
            value: value.to_string(),
            needs,
        }
    }
}

/// `text` as exactly `N` bytes of hex digits (two per byte), if it is.
pub(crate) fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let nibble = |c: u8| char::from(c).to_digit(16);
        *o = u8::try_from(nibble(pair[0])? << 4 | nibble(pair[1])?).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_bytes_takes_exact_hex_only() {
        assert_eq!(hex_bytes::<3>("00a1FF"), Some([0x00, 0xA1, 0xFF]));
        assert_eq!(hex_bytes::<3>("00a1F"), None);
        assert_eq!(hex_bytes::<3>("00a1FF00"), None);
        assert_eq!(hex_bytes::<1>("+1"), None);
        assert_eq!(hex_bytes::<1>("g0"), None);
    }
}
