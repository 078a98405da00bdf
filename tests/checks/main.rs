//! Checks on the repository rather than on one protocol: the standing checks on the source
//! ([`standing`]), the error rule ([`error_display`]) and the README's worker and engine built
//! as a fresh crate ([`fresh_crate`]). The compile-fail cases live in their own small crate,
//! `tests/compile-fail/`, so that trybuild rebuilds tether alone and not every
//! dev-dependency.

mod error_display;
mod fresh_crate;
mod standing;
