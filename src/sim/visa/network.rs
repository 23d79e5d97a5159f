//! Which card network the duplex simulator plays, and what differs between
//! them on the wire and on the link. Everything else (framing, fields,
//! network-management codes, reversal MTIs) comes from the spec.
//!
//! - **VISA** (BASE I): a 22-byte header with station IDs on every message;
//!   VISA signs each link on itself (`0800` F70 `001`) before it carries
//!   VISA's requests.
//! - **Mastercard** (Banknet): no header; the member signs on (`0800` DE 70
//!   `061`, group sign-on) and Mastercard routes issuer requests to a link
//!   only once the member has signed on there, and stops at its sign-off
//!   (`062`). Its acquirer reversals are Reversal Requests (`0400`, repeated
//!   `0401`), not advices.

use crate::iso8583::{Mti, Spec};
use crate::wire::{HeaderKind, VisaHeader};

use super::{BANK_STATION, VISA_STATION};

/// The network the simulator plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    Visa,
    Mastercard,
}

impl Network {
    /// The network whose envelope `spec` has: the VISA header is VISA's;
    /// no header is Mastercard's. Any other envelope is not a duplex card
    /// network this simulator knows.
    pub fn of(spec: &Spec) -> Option<Network> {
        match spec.envelope().header {
            HeaderKind::Visa => Some(Network::Visa),
            HeaderKind::None if !spec.envelope().tpdu => Some(Network::Mastercard),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Network::Visa => "VISA",
            Network::Mastercard => "Mastercard",
        }
    }

    /// What precedes the MTI of a message the network sends the bank.
    pub fn envelope(self) -> Vec<u8> {
        match self {
            Network::Visa => VisaHeader::new(BANK_STATION, VISA_STATION, 0).0.to_vec(),
            Network::Mastercard => Vec::new(),
        }
    }

    /// Whether the network signs each link on itself (VISA), rather than
    /// waiting for the member's sign-on (Mastercard).
    pub fn signs_on(self) -> bool {
        self == Network::Visa
    }

    /// The card, terminal, merchant, acquirer ID and retrieval-reference
    /// letter of the network's issuer requests (test data of each network).
    pub fn card(self) -> IssuerRequestData {
        match self {
            Network::Visa => IssuerRequestData {
                pan: "4761739001010119",
                terminal: "VTERM001",
                merchant: "VISAMERCHANT001",
                acquirer: "400050",
                rrn_letter: 'V',
            },
            Network::Mastercard => IssuerRequestData {
                pan: "5413330089010012",
                terminal: "MTERM001",
                merchant: "MCMERCHANT00001",
                acquirer: "001234",
                rrn_letter: 'M',
            },
        }
    }

    /// A reversal the bank owes the network: VISA's advices (`0420`,
    /// `0421`) and, for Mastercard, the acquirer's Reversal Request
    /// (`0400`, `0401`).
    pub fn is_reversal(self, mti: Mti) -> bool {
        crate::sim::ledger::is_reversal(mti)
            || (self == Network::Mastercard && mti.class() == 4 && mti.function() == 0)
    }
}

/// The fields the simulator writes must exist in the spec, with F7 and F11
/// numeric and F37 twelve characters; its envelope says which network it is.
pub(super) fn check_spec(spec: &Spec) -> std::io::Result<Network> {
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
    for id in [2, 3, 4, 7, 11, 32, 37, 39, 41, 49, 70] {
        if spec.field(id).is_none() {
            return Err(bad(format!(
                "sim visa: spec `{}` has no F{id}",
                spec.name()
            )));
        }
    }
    Network::of(spec).ok_or_else(|| {
        bad(format!(
            "sim network: spec `{}` is neither VISA's (its header) nor Mastercard's (no header, no TPDU)",
            spec.name()
        ))
    })
}

/// Fixed values of a network's issuer requests.
pub struct IssuerRequestData {
    pub pan: &'static str,
    pub terminal: &'static str,
    pub merchant: &'static str,
    /// F32, the acquiring institution (n..6 fits both networks).
    pub acquirer: &'static str,
    pub rrn_letter: char,
}
