//! (filled in by the issue-11 work in progress)
