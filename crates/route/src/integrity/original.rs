//! Which original transaction a message is about, as one key: what the
//! store-and-forward queue orders entries by, so that a terminal's 0220
//! reaches the host before the 0420 that reverses it.

use isoswitch_iso8583::Decoded;

/// The original a message is about: its terminal (F41), then the original's
/// STAN, transmission time and acquirer and forwarding institutions in
/// F90's layout (n38 after the MTI). A reversal that names its original in
/// F90 takes them from there; any other message (an advice, a reversal
/// without F90 that keeps the original's STAN) is its own original. `None`
/// without a STAN: nothing to order by. The MTI is left out, so a 0220 and
/// the 0420 naming it share the key. No card data.
pub fn original_key(message: &Decoded) -> Option<String> {
    let text = |id: u16| message.get(id).and_then(|v| v.as_text()).unwrap_or("");
    let named = text(90);
    let elements = if named.len() == 42 && named.bytes().all(|b| b.is_ascii_digit()) {
        named[4..].to_string()
    } else {
        let own = super::original_data_elements(message);
        own.get(4..).unwrap_or_default().to_string()
    };
    let stan = elements.get(..6)?;
    if stan.bytes().all(|b| b == b'0') {
        return None;
    }
    Some(format!("{}/{elements}", text(41).trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use isoswitch_iso8583::{Mti, Value};

    fn message(mti: &str, fields: &[(u16, &str)]) -> Decoded {
        let mut d = Decoded::new(Vec::new(), mti.parse::<Mti>().expect("mti"));
        for (id, text) in fields {
            d.set(*id, Value::text(*text));
        }
        d
    }

    #[test]
    fn a_reversal_naming_its_advice_shares_the_advices_key() {
        let advice = message(
            "0220",
            &[
                (11, "000123"),
                (7, "1206101010"),
                (32, "12345678"),
                (41, "T0000001"),
            ],
        );
        let reversal = message(
            "0420",
            &[
                (11, "000124"),
                (7, "1206101500"),
                (32, "12345678"),
                (41, "T0000001"),
                (90, "022000012312061010100001234567800000000000"),
            ],
        );
        let key = original_key(&advice).expect("advice has a key");
        assert_eq!(key, "T0000001/00012312061010100001234567800000000000");
        assert_eq!(original_key(&reversal), Some(key));
    }

    #[test]
    fn another_terminal_or_stan_is_another_original() {
        let a = message("0220", &[(11, "000123"), (7, "1206101010"), (41, "T1")]);
        let b = message("0220", &[(11, "000123"), (7, "1206101010"), (41, "T2")]);
        let c = message("0220", &[(11, "000124"), (7, "1206101010"), (41, "T1")]);
        assert_ne!(original_key(&a), original_key(&b));
        assert_ne!(original_key(&a), original_key(&c));
    }

    #[test]
    fn no_stan_no_key_and_a_malformed_f90_falls_back_to_own_fields() {
        assert_eq!(original_key(&message("0220", &[(41, "T1")])), None);
        let odd = message("0420", &[(11, "000009"), (41, "T1"), (90, "short")]);
        assert!(original_key(&odd).is_some_and(|k| k.starts_with("T1/000009")));
    }
}
