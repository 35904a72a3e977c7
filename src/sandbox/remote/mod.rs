//! Remote sandboxes (E2B, Daytona): a provider each, the tags and reaper their process lifecycles share, the
//! bounded downloads of their files, and the mirror of their workspace in the review copy.

pub mod daytona;
pub mod download;
pub mod e2b;
pub mod mirror;
pub mod reaper;
