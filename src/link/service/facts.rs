//! What accepting a request learnt of it, kept in its correlator entry
//! while it is in flight, so that none of its endings (an answer, a
//! decline, a timeout reversal, the journal's row) parses it again to ask
//! what it was: its MTI (class, advice, approvable, a reversal request) and
//! where the journal's fields lie.

use crate::iso8583::Mti;
use crate::journal::row::RequestAt;
use crate::route::Checked;
use crate::route::integrity;

/// A request's facts; a few bytes beside its payload.
#[derive(Clone, Copy, Debug)]
pub struct RequestFacts {
    /// Its MTI, as validation read it.
    pub mti: Mti,
    /// Where its journal fields lie (a journaled service whose router
    /// indexes them), for its row.
    pub journal_at: Option<RequestAt>,
}

impl RequestFacts {
    /// The facts of a request the switch made or took from its store
    /// (a health check, an owed message): no journal row.
    pub fn own(mti: Mti) -> RequestFacts {
        RequestFacts {
            mti,
            journal_at: None,
        }
    }

    /// The facts of a checked request, `journal_at` as the service keeps it.
    pub fn of(req: &Checked<'_>, journal_at: Option<RequestAt>) -> RequestFacts {
        RequestFacts {
            mti: req.msg.mti(),
            journal_at,
        }
    }

    /// An authorization or financial request (and its repeat), the only
    /// kind whose approval moves money and may need reversing.
    pub fn is_approvable(&self) -> bool {
        integrity::is_approvable(self.mti)
    }

    /// A request whose node a repeat or a reversal goes back to:
    /// authorizations, financial requests and reversals (classes 1, 2, 4).
    pub fn binds_its_repeats(&self) -> bool {
        matches!(self.mti.class(), 1 | 2 | 4)
    }
}

/// Whether a switch-made answer to a request with this MTI may go out by
/// its kind: never to a reversal request (0400, 0401: the sender's own
/// reversal, which a switch-made 0410 would tell that a host took it, and
/// it would stop repeating), never to an advice (a sender that takes any
/// 0x30 or 0x10 as the acknowledgement would not repeat). `None`: an MTI
/// that could not be read.
pub fn answerable_kind(mti: Option<Mti>) -> Answerable {
    match mti {
        Some(m) if m.class() == 4 && m.function() == 0 => Answerable::NotAReversalRequest,
        Some(m) if integrity::is_advice(m) && m.class() != 8 => Answerable::NotAnAdvice,
        _ => Answerable::Yes,
    }
}

/// What [`answerable_kind`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answerable {
    Yes,
    NotAReversalRequest,
    NotAnAdvice,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mti(s: &[u8; 4]) -> Option<Mti> {
        Mti::new(*s)
    }

    #[test]
    fn reversal_requests_and_advices_get_no_switch_made_answer() {
        assert_eq!(answerable_kind(mti(b"0200")), Answerable::Yes);
        assert_eq!(
            answerable_kind(mti(b"0400")),
            Answerable::NotAReversalRequest
        );
        assert_eq!(
            answerable_kind(mti(b"0401")),
            Answerable::NotAReversalRequest
        );
        assert_eq!(answerable_kind(mti(b"0420")), Answerable::NotAnAdvice);
        assert_eq!(answerable_kind(mti(b"0220")), Answerable::NotAnAdvice);
        assert_eq!(answerable_kind(mti(b"0820")), Answerable::Yes);
        assert_eq!(answerable_kind(None), Answerable::Yes);
    }

    #[test]
    fn authorizations_financials_and_reversals_bind_their_repeats() {
        for (m, binds, approvable) in [
            (b"0100", true, true),
            (b"0201", true, true),
            (b"0400", true, false),
            (b"0800", false, false),
        ] {
            let f = RequestFacts::own(Mti::new(*m).unwrap());
            assert_eq!(f.binds_its_repeats(), binds, "{m:?}");
            assert_eq!(f.is_approvable(), approvable, "{m:?}");
        }
    }
}
