//! The defaults of the config's keys, named for serde's `default = "..."`.

use std::time::Duration;

pub fn capture_enabled() -> bool {
    true
}
pub fn capture_max_file_bytes() -> u64 {
    64 << 20
}
pub fn capture_max_files() -> usize {
    16
}
pub fn capture_max_total_bytes() -> u64 {
    1 << 30
}
pub fn capture_queue() -> usize {
    65_536
}

pub fn max_connections() -> usize {
    1024
}
pub fn max_per_source() -> usize {
    64
}
pub fn idle_timeout() -> Duration {
    Duration::from_secs(300)
}
pub fn partial_frame_timeout() -> Duration {
    Duration::from_secs(5)
}
pub fn write_queue() -> usize {
    4096
}
pub fn oneconnect_idle() -> Duration {
    Duration::from_secs(30)
}
pub fn connections_per_node() -> usize {
    2
}
pub fn min_active() -> usize {
    1
}
pub fn sticky_field() -> u16 {
    41
}
pub fn connect_timeout() -> Duration {
    Duration::from_secs(2)
}
pub fn reconnect_min() -> Duration {
    Duration::from_millis(100)
}
pub fn reconnect_max() -> Duration {
    Duration::from_secs(10)
}
pub fn weight() -> u32 {
    1
}
pub fn check_interval() -> Duration {
    Duration::from_secs(2)
}
pub fn check_timeout() -> Duration {
    Duration::from_secs(1)
}
pub fn max_in_flight() -> usize {
    100_000
}
pub fn max_in_flight_per_connection() -> usize {
    1_000
}
pub fn max_in_flight_per_source() -> usize {
    10_000
}
pub fn keepalive_idle() -> Duration {
    Duration::from_secs(30)
}
pub fn in_link_silence() -> Duration {
    Duration::from_secs(90)
}
pub fn sign_on_retry() -> Duration {
    Duration::from_secs(5)
}
pub fn echo_interval() -> Duration {
    Duration::from_secs(60)
}
pub fn yes() -> bool {
    true
}
pub fn no_sign_on() -> super::SignOn {
    super::SignOn::None
}
