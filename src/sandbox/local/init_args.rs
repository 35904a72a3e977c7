//! The arguments the bridge gives `sandbox-init` (the sandbox's first process, `init.rs`): a server's door, a
//! kept-warm server's linger, and the limits it watches itself where no cgroup holds them.

use super::limits::Limits;
use crate::sandbox::ExecSpec;

/// `sandbox-init`'s arguments for a server's door: the inherited listening fd and the server's port inside.
pub(super) fn door_args(door: Option<(i32, u16)>) -> Vec<String> {
    match door {
        Some((fd, port)) => vec!["--door-fd".into(), fd.to_string(), "--door-port".into(), port.to_string()],
        None => Vec::new(),
    }
}

/// `sandbox-init`'s arguments for a kept-warm server: how long it outlives its last bridge (at least a few seconds:
/// the bridge's first health checks come and go before its event stream holds the door open).
pub(super) fn linger_args(spec: &ExecSpec) -> Vec<String> {
    match (&spec.keep_warm, spec.serve_port) {
        (Some(keep), Some(_)) => {
            vec!["--keep-warm-secs".into(), keep.linger.as_secs().max(MIN_LINGER_SECS).to_string()]
        }
        _ => Vec::new(),
    }
}

/// The shortest linger a kept-warm server gets.
pub const MIN_LINGER_SECS: u64 = 5;

/// The arguments that make `sandbox-init` watch the limits itself.
pub(super) fn watch_args(watch: Option<Limits>) -> Vec<String> {
    match watch {
        Some(limits) => vec![
            "--max-processes".into(),
            limits.max_processes.to_string(),
            "--max-memory".into(),
            limits.max_memory_bytes.to_string(),
        ],
        None => Vec::new(),
    }
}
