//! Date and time fields. Pure: the caller passes the time.

use isoswitch_wire::write_ascii_decimal as write_digits;

/// F7, transmission date and time, `MMDDhhmmss` in UTC, for a time given as
/// seconds since the Unix epoch.
pub fn transmission_date_time(unix_secs: u64) -> [u8; 10] {
    let (_, month, day) = civil_from_days(unix_secs / 86_400);
    let rem = unix_secs % 86_400;
    let mut out = [b'0'; 10];
    write_digits(&mut out[0..2], month);
    write_digits(&mut out[2..4], day);
    write_digits(&mut out[4..6], rem / 3600);
    write_digits(&mut out[6..8], rem / 60 % 60);
    write_digits(&mut out[8..10], rem % 60);
    out
}

/// Year, month (1..=12), day (1..=31) of a count of days since 1970-01-01
/// (H. Hinnant's `civil_from_days`).
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        // 2024-02-29 is day 19782.
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(19_783), (2024, 3, 1));
    }

    #[test]
    fn f7_is_mmddhhmmss_utc() {
        // 2026-12-02 14:52:46 UTC.
        assert_eq!(&transmission_date_time(1_796_223_166), b"1202145246");
        assert_eq!(&transmission_date_time(0), b"0101000000");
    }
}
