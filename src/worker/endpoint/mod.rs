//! The worker side of a worker session (placeholder; being written).
