//! The message type indicator.

use std::fmt;
use std::str::FromStr;

/// A message type indicator, held as four ASCII digits whatever its wire encoding
/// (ASCII, BCD or EBCDIC): version, class, function, origin.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mti([u8; 4]);

impl Mti {
    /// `digits` must be four ASCII decimal digits.
    pub const fn new(digits: [u8; 4]) -> Option<Mti> {
        let mut i = 0;
        while i < 4 {
            if !digits[i].is_ascii_digit() {
                return None;
            }
            i += 1;
        }
        Some(Mti(digits))
    }

    /// The four ASCII digits.
    pub const fn digits(&self) -> [u8; 4] {
        self.0
    }

    pub fn as_str(&self) -> &str {
        // Invariant: four ASCII digits.
        std::str::from_utf8(&self.0).unwrap_or("????")
    }

    /// Version digit (0 = ISO 8583:1987).
    pub const fn version(&self) -> u8 {
        self.0[0] - b'0'
    }

    /// Class digit (1 authorization, 2 financial, 4 reversal, 8 network management...).
    pub const fn class(&self) -> u8 {
        self.0[1] - b'0'
    }

    /// Function digit (0 request, 1 request response, 2 advice, 3 advice response...).
    pub const fn function(&self) -> u8 {
        self.0[2] - b'0'
    }

    /// Origin digit (0 acquirer, 1 acquirer repeat, 2 issuer, 3 issuer repeat...).
    pub const fn origin(&self) -> u8 {
        self.0[3] - b'0'
    }

    /// A request, advice or notification: something that expects (or may get) a
    /// response. Function digit even.
    pub const fn is_request(&self) -> bool {
        self.function().is_multiple_of(2)
    }

    /// A response: function digit odd.
    pub const fn is_response(&self) -> bool {
        !self.is_request()
    }

    /// A repeat: origin digit odd (0201, 0421...).
    pub const fn is_repeat(&self) -> bool {
        self.origin() % 2 == 1
    }

    /// Class 8: sign-on/off, echo test, key exchange, cut-over.
    pub const fn is_network_management(&self) -> bool {
        self.class() == 8
    }

    /// The MTI of the response to this request: function digit + 1, and a repeat
    /// maps to the same response class (0100→0110, 0201→0210, 0420→0430,
    /// 0800→0810, 0820→0830, 0203→0212). `None` if this is already a response.
    pub const fn response(&self) -> Option<Mti> {
        if !self.is_request() {
            return None;
        }
        let [v, c, f, o] = self.0;
        Some(Mti([v, c, f + 1, o & !1]))
    }
}

/// Why a text is not an MTI: [`Mti`]'s `FromStr` error, the only one.
pub(crate) const NOT_AN_MTI: &str = "an MTI is four digits";

impl FromStr for Mti {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Mti, Self::Err> {
        let digits: [u8; 4] = s.as_bytes().try_into().map_err(|_| NOT_AN_MTI)?;
        Mti::new(digits).ok_or(NOT_AN_MTI)
    }
}

impl fmt::Display for Mti {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Mti {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mti({})", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Mti {
        s.parse().unwrap()
    }

    #[test]
    fn response_table() {
        for (req, resp) in [
            ("0100", "0110"),
            ("0101", "0110"),
            ("0120", "0130"),
            ("0200", "0210"),
            ("0201", "0210"),
            ("0203", "0212"),
            ("0220", "0230"),
            ("0400", "0410"),
            ("0420", "0430"),
            ("0421", "0430"),
            ("0800", "0810"),
            ("0820", "0830"),
        ] {
            assert_eq!(m(req).response(), Some(m(resp)), "{req}");
        }
        assert_eq!(m("0210").response(), None);
        assert_eq!(m("0830").response(), None);
    }

    #[test]
    fn predicates() {
        assert!(m("0200").is_request());
        assert!(m("0210").is_response());
        assert!(m("0201").is_repeat());
        assert!(m("0820").is_network_management());
        assert!(!m("0200").is_network_management());
        assert_eq!(m("0420").to_string(), "0420");
        assert_eq!(format!("{:?}", m("0420")), "Mti(0420)");
    }

    #[test]
    fn rejects_non_digits() {
        assert!("02A0".parse::<Mti>().is_err());
        assert!("020".parse::<Mti>().is_err());
        assert!(Mti::new(*b"0200").is_some());
    }
}
