//! GPU conformance suite helpers.
