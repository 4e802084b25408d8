//! Keeps the pump and the dispatcher running. A panic (a bug) ends a task,
//! and the events' tasks are started once per process: unwatched, a
//! panicking pump made no more events and a panicking dispatcher sent none,
//! without a sign, until the process restarted. [`supervised`] starts the
//! task again instead, logs the panic and counts it in
//! `stockguard_events_task_panics_total{task}` (docs/operations.md), so an
//! operator sees it and nothing waits for a restart. What a task had not
//! committed is done again: a pass wrote nothing, an unrecorded delivery is
//! sent again (at least once).

use std::time::Duration;

use tokio::sync::watch;

use crate::telemetry;

/// How long a task that panicked waits before it starts again: a bug that
/// panics at every start would otherwise spin and fill the log.
pub(crate) const PAUSE: Duration = Duration::from_secs(1);

/// Runs the task `start` makes until it ends of itself (asked to `stop`)
/// or `stop` turns true while it is down; each time it panics, logs and
/// counts the panic as `task`'s and starts it again after `pause`. How many
/// times it panicked.
pub(crate) async fn supervised<F, T>(
    task: &'static str,
    pause: Duration,
    mut stop: watch::Receiver<bool>,
    mut start: F,
) -> u64
where
    F: FnMut() -> T,
    T: Future<Output = ()> + Send + 'static,
{
    let mut panics = 0;
    loop {
        match tokio::spawn(start()).await {
            Err(err) if err.is_panic() => {
                panics += 1;
                tracing::error!(task, error = %err, "an events task panicked; it starts again");
                telemetry::events_task_panicked(task);
            }
            // Ended (asked to stop), or cancelled with its runtime.
            Ok(()) | Err(_) => return panics,
        }
        if *stop.borrow() {
            return panics;
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return panics,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        pin::Pin,
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering::SeqCst},
        },
    };

    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

    /// A task that panics the first `times` times it runs, then ends; and
    /// how often it started.
    fn panicking(times: usize) -> (Arc<AtomicUsize>, impl FnMut() -> Task) {
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        let start = move || -> Task {
            let started = counted.fetch_add(1, SeqCst);
            Box::pin(async move { assert!(started >= times, "a bug in the task") })
        };
        (starts, start)
    }

    #[test]
    fn a_task_that_panics_is_started_again_and_each_panic_is_counted() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let metrics = recorder.handle();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        let (_stop, stopped) = watch::channel(false);
        let (starts, start) = panicking(2);
        // The recorder is this thread's, where the supervisor counts.
        let panics = metrics::with_local_recorder(&recorder, || {
            runtime.block_on(supervised("pump", Duration::from_millis(1), stopped, start))
        });
        assert_eq!((panics, starts.load(SeqCst)), (2, 3), "(panics, starts)");
        let text = metrics.render();
        assert!(text.contains("stockguard_events_task_panics_total{task=\"pump\"} 2"), "{text}");
    }

    #[tokio::test]
    async fn a_task_that_ends_of_itself_is_not_started_again() {
        let (_stop, stopped) = watch::channel(false);
        let (starts, start) = panicking(0);
        let panics = supervised("dispatcher", Duration::from_millis(1), stopped, start).await;
        assert_eq!((panics, starts.load(SeqCst)), (0, 1), "(panics, starts)");
    }

    #[tokio::test]
    async fn a_stop_ends_the_supervision_of_a_panicked_task_without_waiting_out_its_pause() {
        let (stop, stopped) = watch::channel(false);
        let (starts, start) = panicking(usize::MAX);
        let supervising = tokio::spawn(supervised("pump", Duration::from_secs(3600), stopped, start));
        while starts.load(SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        stop.send(true).expect("the supervisor listens");
        let ended = tokio::time::timeout(Duration::from_secs(10), supervising).await;
        let panics = ended.expect("ended within its pause").expect("the supervisor did not panic");
        assert_eq!((panics, starts.load(SeqCst)), (1, 1), "(panics, starts)");
    }
}
