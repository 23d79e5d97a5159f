//! Spec-driven ISO 8583 messages (to be completed).
