//! What a turn sends to the editor, in the order it was stored and only once stored: the acknowledgement of one
//! queued write (`Ack`) and the outbox that hands updates on behind their acknowledgements, in runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};

use tokio::sync::oneshot;

use super::{Result, StoreError, lock};

/// Resolves when the store has committed one queued write (see [`Store::queue_event`]).
#[must_use = "a write is only persisted once its acknowledgement says so"]
pub struct Ack(pub(super) oneshot::Receiver<Result<()>>);

impl Ack {
    /// The outcome if the write is already committed (or failed), without waiting; `None` while it is not.
    fn now(&mut self) -> Option<Result<()>> {
        match self.0.try_recv() {
            Ok(reply) => Some(reply),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(StoreError::Stopped)),
        }
    }
}

impl Future for Ack {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|reply| reply.unwrap_or(Err(StoreError::Stopped)))
    }
}

/// Hands items on in order, each only once the store acknowledged the write that goes with it: what a turn
/// sends to the editor is exactly what the store kept. After a failed write nothing more is handed on.
///
/// Items are handed on in runs: with the first one waited for come all that follow it already acknowledged (a
/// commit acknowledges its whole batch at once), so that a fast stream costs its editor one hand-off per commit
/// rather than one per update. A run never waits for more: an update alone in the queue goes on by itself.
pub struct Outbox<T> {
    queue: Mutex<Option<tokio::sync::mpsc::UnboundedSender<(Ack, T)>>>,
    failure: Arc<Mutex<Option<StoreError>>>,
    forwarder: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Held while a run is handed on, so that once [`Outbox::mute`] returns nothing more is.
    muted: Arc<Mutex<bool>>,
}

/// The most items of one run, so that one run's memory stays bounded whatever the backlog (and its message
/// stays below the allocator's threshold for a mapping of its own: a run of short updates takes some 50 KiB).
const OUTBOX_RUN: usize = 256;

impl<T: Send + 'static> Outbox<T> {
    /// An outbox handing runs of items, in order, to `deliver` (on a task of its own; must be called within a
    /// tokio runtime).
    pub fn new(mut deliver: impl FnMut(Vec<T>) + Send + 'static) -> Self {
        let (queue, mut items) = tokio::sync::mpsc::unbounded_channel::<(Ack, T)>();
        let failure = Arc::new(Mutex::new(None));
        let failed = failure.clone();
        let muted = Arc::new(Mutex::new(false));
        let silenced = muted.clone();
        let forwarder = tokio::spawn(async move {
            // An item taken from the queue whose write was not committed yet: the next run starts with it.
            let mut waiting: Option<(Ack, T)> = None;
            loop {
                let Some((ack, item)) = (match waiting.take() {
                    Some(next) => Some(next),
                    None => items.recv().await,
                }) else {
                    return;
                };
                let mut failure = ack.await.err();
                let mut run = Vec::new();
                if failure.is_none() {
                    run.push(item);
                    while run.len() < OUTBOX_RUN
                        && let Ok((mut ack, item)) = items.try_recv()
                    {
                        match ack.now() {
                            Some(Ok(())) => run.push(item),
                            Some(Err(error)) => {
                                failure = Some(error);
                                break;
                            }
                            None => {
                                waiting = Some((ack, item));
                                break;
                            }
                        }
                    }
                }
                if !run.is_empty() {
                    let muted = lock(&silenced);
                    if !*muted {
                        deliver(run);
                    }
                }
                if let Some(error) = failure {
                    *lock(&failed) = Some(error);
                    return;
                }
            }
        });
        Self { queue: Mutex::new(Some(queue)), failure, forwarder: Mutex::new(Some(forwarder)), muted }
    }

    /// Hands nothing more on, from now: what still waits for the store is kept once it is written, but not
    /// handed on (a cancelled turn is answered without waiting for a store that cannot write, and ACP allows no
    /// update of a turn after its answer).
    pub fn mute(&self) {
        *lock(&self.muted) = true;
    }

    /// Hands `item` on once `ack` resolves. Fails at once if an earlier write failed (with that failure).
    pub fn push(&self, ack: Ack, item: T) -> Result<()> {
        if let Some(error) = lock(&self.failure).clone() {
            return Err(error);
        }
        let sent = lock(&self.queue).as_ref().map(|queue| queue.send((ack, item)).is_ok());
        match sent {
            Some(true) => Ok(()),
            _ => Err(lock(&self.failure).clone().unwrap_or(StoreError::Stopped)),
        }
    }

    /// Waits until every item pushed so far is handed on; the first failed write, if any.
    pub async fn flush(&self) -> Result<()> {
        lock(&self.queue).take();
        let forwarder = lock(&self.forwarder).take();
        if let Some(forwarder) = forwarder {
            let _ = forwarder.await;
        }
        match lock(&self.failure).clone() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}
