//! Unit tests of the service: its routing decisions and answers, without sockets.

use super::*;
use crate::route::CorrelationKey;

/// The fixed part of a request in flight, as docs/config.md states it
/// (memory per request in flight): a key in the table and in the deadline
/// index, the pending state and its origin. The request's bytes come on top.
#[test]
fn instances_start_their_stans_apart() {
    let toml = "[[service]]\nname = \"up\"\nspec = \"cups\"\n\
         [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n\
         [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n";
    let cfg = crate::config::Config::from_toml(toml).expect("config");
    let firsts: Vec<u32> = (0..3)
        .map(|_| {
            let spec = Spec::builtin("cups").expect("cups");
            let svc = Service::new(cfg.services[0].clone(), spec, Instant::now()).expect("service");
            let stan = svc.made.next_stan();
            assert!((1..=999_999).contains(&stan));
            assert_eq!(svc.made.next_stan(), stan % 999_999 + 1, "then one by one");
            stan
        })
        .collect();
    assert!(
        firsts.windows(2).any(|w| w[0] != w[1]),
        "three instances of one config start at the same STAN: {firsts:?}"
    );
}

#[test]
fn fixed_memory_per_request_in_flight_is_as_documented() {
    let key = std::mem::size_of::<CorrelationKey>();
    let pending = std::mem::size_of::<Pending>();
    assert!(key <= 72, "key {key} bytes");
    // Table entry (key + pending + deadline + tag) and index entry (key +
    // deadline + sequence), before the maps' own overhead.
    let fixed = key + pending + 32 + key + 24;
    assert!(fixed <= 400, "{fixed} bytes before map overhead");
}
