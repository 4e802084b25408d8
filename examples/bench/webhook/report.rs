//! The `--webhook` section of the report and its lines of the targets.

use super::{DRAIN_LIMIT, LagWindow, Webhook};
use crate::{
    pairs::{self, Pair},
    report::ratio,
};

/// A lag for the report.
fn ms(lag: Option<f64>) -> String {
    lag.map_or_else(|| "not arrived".to_owned(), |ms| format!("{ms:.0} ms"))
}

impl Webhook {
    /// Errors over its runs.
    pub fn errors(&self) -> u64 {
        self.cells.iter().map(Pair::errors).sum::<u64>() + self.lag.load.errors
    }

    /// The lowest with / without res/s ratio of its cells.
    fn worst(&self) -> Option<(&Pair, f64)> {
        pairs::worst(&self.cells)
    }

    /// Whether the lag grows over the sustained run: the last window's p99
    /// above 1.5× the first's plus 50 ms (or not arrived), the backlog at
    /// the end above the one at mid-run by more than 10 bodies, or no drain.
    fn grows(&self) -> bool {
        let lag = &self.lag;
        let p99 = |w: Option<&LagWindow>| w.and_then(|w| w.lags.p99_ms);
        let later = match (p99(lag.windows.first()), p99(lag.windows.last())) {
            (Some(first), Some(last)) => last > 1.5 * first + 50.0,
            _ => true,
        };
        later || lag.backlog_end > lag.backlog_mid + 1000 || !lag.drained
    }

    /// Its lines of the report's targets: (target, measured, met).
    pub fn targets(&self) -> Vec<(String, String, Option<bool>)> {
        let mut out = Vec::new();
        let target = "HOT and SPREAD with one webhook endpoint ≥ 0.90× without, in the same rounds".to_owned();
        out.push(match self.worst() {
            Some((c, r)) => {
                let measured = format!("{r:.2}× at {} x{} (the lowest with / without)", c.scenario.name(), c.clients);
                (target, measured, Some(r >= 0.9))
            }
            None => (target, "not measured".into(), None),
        });
        let d = &self.delivered;
        out.push((
            "every committed stock change delivered, in order, signed".into(),
            format!(
                "{} missing of {} ({} of them lost: recorded as delivered; {}), {} out of order, {} bad bodies",
                d.missing,
                d.committed,
                d.lost,
                if d.drained { "drained" } else { "not drained, the rest may be late" },
                d.out_of_order,
                d.bad
            ),
            Some(d.held()),
        ));
        let lag = &self.lag;
        let p99 = |w: Option<&LagWindow>| ms(w.and_then(|w| w.lags.p99_ms));
        out.push((
            format!("events' lag at SPREAD x{} does not grow over {} s", lag.clients, lag.load.seconds),
            format!(
                "p99 {} in the first window, {} in the last; backlog {} at mid-run, {} at the end; {}",
                p99(lag.windows.first()),
                p99(lag.windows.last()),
                lag.backlog_mid,
                lag.backlog_end,
                if lag.drained { "drained" } else { "not drained" },
            ),
            Some(!self.grows()),
        ));
        out
    }

    /// The report's section.
    pub fn markdown(&self) -> String {
        let mut md = String::from(
            "\n## Events out: one webhook endpoint\n\n\
             A second server of this build, on a database of its own seeded the same way, with one endpoint \
             subscribed to every event type (made through `createWebhook`; `STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK=true` \
             so it may be `http://127.0.0.1`), pointing at a receiver in the benchmark process that answers \
             every body with 204 (on a thread of its own, keeping each body to be checked after the cells, as \
             docs/webhooks.md tells receivers: answer, then work). After the sustained run below, it took turns round by round with the main server, which has no endpoint (and \
             the older database: the cells before ran on it). With / without = res/s with the endpoint over \
             res/s without. CPU µs per reservation as in the first table; the endpoint's server's PostgreSQL \
             CPU includes the event pump's and the dispatcher's backends; the receiver's CPU is in neither.\n\n",
        );
        md.push_str(&pairs::table(&self.cells, ["without", "with"]));
        let lag = &self.lag;
        let (l, all) = (&lag.load, &lag.lags);
        md.push_str(&format!(
            "\nThe lag from commit to delivery: SPREAD at {} clients on the server with the endpoint alone for \
             {:.0} s ({:.0} res/s, p99 {:.2} ms), each stock change's first arrival at the receiver minus its \
             `occurredAt` (the start of the transaction that committed it, a statement here), by the window of \
             `occurredAt` it fell in. A change that had not arrived when the drain ended (at most {} s after \
             the load) counts as later than all that had: a quantile that falls on one is \"not arrived\". The \
             backlog is the events the pump had numbered that no delivery had taken (`event_pump.last_seq` − \
             the endpoint's `sent_through`) at the window's end; events not yet numbered are not in it. Over \
             the run: {} of {} changes arrived, p50 {}, p99 {}, max {}; backlog {} at mid-run, {} when the \
             load stopped; {} {:.1} s after it stopped. The receiver got {:.0} events/s from the start of the \
             run to the end of the drain; the load made two a reservation (STOCK_CHANGED, RESERVATION_CHANGED), \
             {:.0}/s.\n\n\
             | from s | changes committed | arrived | p50 | p99 | max | backlog at its end |\n\
             |--:|--:|--:|--:|--:|--:|--:|\n",
            lag.clients,
            l.seconds,
            l.per_sec(l.successes),
            l.p99_ms,
            DRAIN_LIMIT.as_secs(),
            all.arrived,
            all.committed,
            ms(all.p50_ms),
            ms(all.p99_ms),
            ms(all.max_ms),
            lag.backlog_mid,
            lag.backlog_end,
            if lag.drained { "drained" } else { "NOT drained" },
            lag.drain_secs,
            lag.delivered_per_sec,
            2.0 * l.per_sec(l.successes),
        ));
        for w in &lag.windows {
            let (backlog, lags) = (w.backlog.map_or_else(|| "–".to_owned(), |b| b.to_string()), &w.lags);
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {backlog} |\n",
                w.from_secs,
                lags.committed,
                lags.arrived,
                ms(lags.p50_ms),
                ms(lags.p99_ms),
                ms(lags.max_ms)
            ));
        }
        let d = &self.delivered;
        md.push_str(&format!(
            "\nWhat arrived, over every run on that server (the sustained run first, then the cells), by the end \
             of a last drain of at most {} s ({}): {} events in {} bodies ({:.1} events a body); of the {} stock \
             changes committed after the endpoint existed, {} missing, of which {} lost (in a delivery the \
             server recorded as DELIVERED) and the rest not yet sent; {} STOCK_CHANGED repeats (at least once \
             allows them), {} out of version order, {} bodies not signed with the endpoint's secret or not \
             readable.\n",
            DRAIN_LIMIT.as_secs(),
            if d.drained { "drained" } else { "NOT drained" },
            d.events,
            d.bodies,
            ratio(d.events as f64, d.bodies as f64),
            d.committed,
            d.missing,
            d.lost,
            d.repeats,
            d.out_of_order,
            d.bad,
        ));
        md
    }
}
