//! Pure routing logic (to be completed).
