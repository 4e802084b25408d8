//! The background lane: a thread of its own at the lowest CPU priority a
//! thread can give itself without privileges (nice 19 on Linux), where the
//! queries of callers that take more than their share run
//! (`Admitted::execute` decides which).
//!
//! On a machine with few cores the server runs one worker thread (`cli.rs`),
//! and an admitted query that resolves a thousand fields holds that thread
//! for milliseconds without a pause: a small request arriving behind it
//! waits all of it out, whatever the budgets say, because points do not
//! measure how long a thread is held. On a thread of its own such a query
//! is preempted by the OS whenever the runtime's threads or PostgreSQL
//! want the core, and still has every idle cycle.
//!
//! Only the polling happens here. Each operation is polled inside the
//! runtime's context (`Handle::enter`), so the sockets, timers and tasks it
//! makes (a pool's new connection, a DataLoader's batch) belong to the
//! runtime: nothing that another caller may wait on is ever driven by this
//! low-priority thread.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use tokio::{
    runtime::Handle,
    sync::{mpsc, oneshot},
};

/// A job of the lane: an operation's work, which sends its own result.
type Job = BoxFuture<'static, ()>;

/// Where background work is sent; cheap to clone. The thread ends when the
/// last clone is dropped.
#[derive(Clone)]
pub(super) struct Background {
    /// The lane's queue; `None` where there is no lane (no runtime to lend
    /// its context, or the thread could not start): work then runs in place.
    jobs: Option<mpsc::UnboundedSender<Job>>,
}

impl Background {
    /// Starts the lane's thread, lending it the current runtime's context.
    pub(super) fn start() -> Self {
        let Ok(runtime) = Handle::try_current() else { return Self { jobs: None } };
        let (jobs, queue) = mpsc::unbounded_channel();
        let started =
            std::thread::Builder::new().name("stockguard-background".into()).spawn(move || serve(queue, runtime));
        match started {
            Ok(_) => Self { jobs: Some(jobs) },
            Err(err) => {
                tracing::warn!(error = %err, "cannot start the background lane; every operation runs on the runtime");
                Self { jobs: None }
            }
        }
    }

    /// Runs `work` on the lane (sent at once, so it runs to its end even if
    /// the returned future is dropped); its output, or `None` if it panicked.
    pub(super) fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> impl Future<Output = Option<T>> + Send + 'static {
        let (done, output) = oneshot::channel();
        let job: Job = Box::pin(async move {
            let _ = done.send(work.await);
        });
        let in_place = match &self.jobs {
            Some(jobs) => jobs.send(job).err().map(|returned| returned.0),
            None => Some(job),
        };
        async move {
            if let Some(job) = in_place {
                job.await;
            }
            output.await.ok()
        }
    }
}

/// The lane's thread: lowers its own priority, then polls every job sent
/// to it, each on a task of a runtime without drivers of its own.
fn serve(mut queue: mpsc::UnboundedReceiver<Job>, runtime: Handle) {
    lower_priority();
    let lane = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(lane) => lane,
        Err(err) => {
            tracing::warn!(error = %err, "cannot build the background lane; its work runs on the runtime");
            // Whatever arrives is run where it would have run without a lane.
            while let Some(job) = queue.blocking_recv() {
                runtime.spawn(job);
            }
            return;
        }
    };
    lane.block_on(async move {
        while let Some(job) = queue.recv().await {
            tokio::spawn(Entered { runtime: runtime.clone(), job });
        }
    });
}

/// Gives this thread the lowest priority (nice 19). On Linux a thread's
/// nice value is its own, so the runtime's threads keep theirs.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    if let Err(err) = rustix::process::setpriority_process(None, 19) {
        tracing::warn!(error = %err, "cannot lower the background lane's priority");
    }
}

/// A job polled inside the runtime's context.
struct Entered {
    runtime: Handle,
    job: Job,
}

impl Future for Entered {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let _context = this.runtime.enter();
        this.job.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The work runs on the lane's thread, and what it spawns and the
    /// timers it sets belong to the runtime that started the lane.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn work_runs_on_the_lane_and_what_it_makes_belongs_to_the_runtime() {
        let lane = Background::start();
        let name = || std::thread::current().name().map(str::to_owned);
        let (thread, spawned_on) = lane
            .run(async move {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                let spawned = tokio::spawn(async move { name() }).await.expect("spawned");
                (name(), spawned)
            })
            .await
            .expect("ran");
        assert_eq!(thread.as_deref(), Some("stockguard-background"));
        let worker = spawned_on.unwrap_or_default();
        assert!(worker.starts_with("tokio-"), "a task it spawned ran on the runtime's worker, not on {worker:?}");
        assert!(lane.run(async { panic!("a job that panics") }).await.is_none());
        assert_eq!(lane.run(async { 7 }).await, Some(7), "the lane lives on after a panic");
    }
}
