//! Remote sandboxes (E2B, Daytona): a provider each, listed in [`REMOTES`], the tags and reaper their process
//! lifecycles share, the bounded downloads of their files, and the mirror of their workspace in the review copy.

pub mod daytona;
pub mod download;
pub mod e2b;
pub mod mirror;
pub mod reaper;

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{CheckLine, SandboxError, SandboxProvider};

/// The settings a remote provider reads: the bridge's environment, and a key `acp-sandbox login --provider` stored.
pub type Vars<'a> = &'a (dyn Fn(&str) -> Option<String> + Sync);

/// One remote sandbox provider, as `--sandbox <name>` selects it: adding one is a folder here and a line in
/// [`REMOTES`].
pub trait Remote: Send + Sync + 'static {
    /// Its name on the command line, in the store and in `doctor`.
    fn name(&self) -> &'static str;
    /// What `--sandbox <name>` does, for `--help`.
    fn help(&self) -> &'static str;
    /// What one sandbox of it is called in a sentence ("an E2B sandbox").
    fn one_sandbox(&self) -> &'static str;
    /// The variable its API key comes in.
    fn key_variable(&self) -> &'static str;
    /// Where a person gets a key.
    fn key_page(&self) -> &'static str;
    /// The provider of the sessions' sandboxes, configured by `vars`.
    fn open(&self, vars: Vars<'_>) -> Result<Arc<dyn SandboxProvider>, SandboxError>;
    /// `doctor`'s lines about it when it is selected: its key, its API, what a session would use.
    fn check<'a>(&self, vars: Vars<'a>) -> BoxFuture<'a, Vec<CheckLine>>;
}

/// Every remote provider, one line each.
pub static REMOTES: &[&dyn Remote] = &[&e2b::E2b, &daytona::Daytona];

/// The remote provider of this name.
pub fn named(name: &str) -> Option<&'static dyn Remote> {
    REMOTES.iter().copied().find(|remote| remote.name() == name)
}
