//! Files the agent can write, handled without trusting them: the review copy of a workspace (`review.rs`: sync,
//! changes, apply), what git ignores there (`ignore.rs`) and the bridge's own file work in a state dir
//! (`statedir.rs`). Below `sandbox/`, which mounts them, and free of it.

pub mod ignore;
pub mod review;
pub mod statedir;
