//! Start limits that follow progress rather than a clock: a starting agent (its `initialize`, OpenCode's server
//! start) is waited for while its sandbox's processes use CPU or wait to run, however loaded the machine; one that
//! stalled (nothing used or runnable for [`STALLED_AFTER`]) is reported. Where the sandbox cannot tell (a remote
//! one), only [`START_CAP`] bounds the wait; a process that died ends its start by itself.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::process::Activity;

/// After this long a start is said to be slow (a note in the thread).
pub const NOTE_AFTER: Duration = Duration::from_secs(5);

/// A start whose processes used no CPU and had nothing runnable for this long has stalled.
pub const STALLED_AFTER: Duration = Duration::from_secs(20);

/// No start, however busy, is waited for longer.
pub const START_CAP: Duration = Duration::from_secs(600);

/// How often the processes are looked at.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// How a wait for a start ended.
#[derive(Debug)]
pub enum Waited<T> {
    Done(T),
    /// No progress for [`STALLED_AFTER`]; the start had lasted this long.
    Stalled(Duration),
    /// Progress all along, but longer than [`START_CAP`].
    TooLong,
}

impl<T> Waited<T> {
    /// Why a start that did not finish was given up, in words for the user (`what`: "answer initialize").
    pub fn why(&self, what: &str) -> String {
        match self {
            Waited::Done(_) => String::new(),
            Waited::Stalled(_) => format!(
                "it did not {what} and made no progress (no CPU used, nothing running) for {} s",
                STALLED_AFTER.as_secs()
            ),
            Waited::TooLong => format!("it did not {what} within {} s", START_CAP.as_secs()),
        }
    }
}

/// Whether a process tree makes progress, sample by sample.
#[derive(Debug)]
pub struct Watch {
    last: Option<Activity>,
    progressed: Instant,
}

impl Watch {
    pub fn new(now: Instant) -> Self {
        Watch { last: None, progressed: now }
    }

    /// Takes a sample (`None`: the sandbox cannot tell, which counts as progress) and answers whether the tree has
    /// stalled: nothing runnable and no CPU used since [`STALLED_AFTER`] ago.
    pub fn stalled(&mut self, sample: Option<Activity>, now: Instant) -> bool {
        let moved = match (sample, self.last) {
            (None, _) => true,
            (Some(sample), Some(last)) => {
                sample.busy || sample.cpu_ticks != last.cpu_ticks || sample.processes != last.processes
            }
            (Some(_), None) => true,
        };
        if sample.is_some() {
            self.last = sample;
        }
        if moved {
            self.progressed = now;
        }
        now.duration_since(self.progressed) >= STALLED_AFTER
    }
}

/// Waits for `step` while the processes `activity` looks at make progress; calls `slow` once when it has taken
/// [`NOTE_AFTER`].
pub async fn patiently<T>(
    step: impl Future<Output = T>,
    mut activity: impl FnMut() -> Option<Activity>,
    slow: impl FnOnce(),
) -> Waited<T> {
    let started = Instant::now();
    let mut watch = Watch::new(started);
    let mut slow = Some(slow);
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tokio::pin!(step);
    loop {
        tokio::select! {
            done = &mut step => return Waited::Done(done),
            _ = tick.tick() => {
                let now = Instant::now();
                if watch.stalled(activity(), now) {
                    return Waited::Stalled(now.duration_since(started));
                }
                if now.duration_since(started) >= START_CAP {
                    return Waited::TooLong;
                }
                if now.duration_since(started) >= NOTE_AFTER && let Some(slow) = slow.take() {
                    slow();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ticks: u64, busy: bool) -> Option<Activity> {
        Some(Activity { cpu_ticks: ticks, busy, processes: 1 })
    }

    #[test]
    fn only_a_tree_that_neither_used_cpu_nor_had_anything_runnable_stalls() {
        let start = Instant::now();
        let mut watch = Watch::new(start);
        assert!(!watch.stalled(at(5, false), start));
        // Idle, but not for long enough.
        assert!(!watch.stalled(at(5, false), start + STALLED_AFTER / 2));
        // CPU used: progress.
        assert!(!watch.stalled(at(6, false), start + STALLED_AFTER));
        // Waiting to run (a loaded machine) is progress too.
        assert!(!watch.stalled(at(6, true), start + STALLED_AFTER * 2));
        assert!(!watch.stalled(at(6, false), start + STALLED_AFTER * 2 + STALLED_AFTER / 2));
        assert!(watch.stalled(at(6, false), start + STALLED_AFTER * 3));
        // A sandbox that cannot tell never stalls (only the cap bounds it).
        let mut blind = Watch::new(start);
        assert!(!blind.stalled(None, start + STALLED_AFTER * 5));
    }
}
