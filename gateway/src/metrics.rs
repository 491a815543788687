//! `/metrics` in Prometheus' text format. Counters and histograms are this gateway's own
//! observations; runs by status, pending interactions and the queue's figures are read from
//! Redis and JetStream at scrape time, so every gateway reports the same fleet-wide values.
//! Those readings, and `/readyz`'s, are kept a second ([`Fresh`]): both endpoints are open.

use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A reading of the servers kept for a while: `/readyz` and `/metrics` are open (probes and
/// scrapers carry no token), so a flood of requests to them must not become a flood of Redis
/// and NATS calls. Requests that come while a reading is under way wait for it.
pub struct Fresh<T> {
    max_age: std::time::Duration,
    slot: tokio::sync::Mutex<Option<(std::time::Instant, T)>>,
}

impl<T: Clone> Fresh<T> {
    pub fn new(max_age: std::time::Duration) -> Self {
        Fresh {
            max_age,
            slot: tokio::sync::Mutex::new(None),
        }
    }

    /// The last reading if it is younger than the maximum age, else a new one by `read`.
    pub async fn get<F: std::future::Future<Output = T>>(&self, read: impl FnOnce() -> F) -> T {
        let mut slot = self.slot.lock().await;
        if let Some((at, v)) = &*slot
            && at.elapsed() < self.max_age
        {
            return v.clone();
        }
        let v = read().await;
        *slot = Some((std::time::Instant::now(), v.clone()));
        v
    }
}

/// How long `/readyz`'s and `/metrics`' readings of Redis and NATS are kept.
pub const PROBES_KEPT: std::time::Duration = std::time::Duration::from_secs(1);

/// What `/readyz` and `/metrics` read of the servers, each kept [`PROBES_KEPT`].
pub struct Probes {
    /// Whether Redis and NATS answer.
    pub ready: Fresh<delta_api::Readiness>,
    /// Runs by status and questions pending (Redis), and the queue's figures (JetStream).
    pub figures: Fresh<Figures>,
}

/// Runs by status and questions pending, and the queue's figures; `None` where a server did not
/// answer.
pub type Figures = (
    Option<(
        std::collections::HashMap<delta_protocol::RunStatus, u64>,
        u64,
    )>,
    Option<delta_queue::Stats>,
);

impl Default for Probes {
    fn default() -> Self {
        Probes {
            ready: Fresh::new(PROBES_KEPT),
            figures: Fresh::new(PROBES_KEPT),
        }
    }
}

/// Label set of a per-status gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct StatusLabel {
    pub status: String,
}

/// Label set of answers by channel.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ViaLabel {
    pub via: String,
}

/// Label set of answers that waited for their question to be heard: whether it was.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct HeardLabel {
    pub heard: &'static str,
}

/// This gateway's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    pub runs: Family<StatusLabel, Gauge>,
    pub pending_interactions: Gauge,
    pub jobs_pending: Gauge,
    pub jobs_in_flight: Gauge,
    pub jobs_redelivered: Gauge,
    pub jobs_dead_lettered: Gauge,
    pub runs_submitted: Counter,
    pub answers_accepted: Family<ViaLabel, Counter>,
    pub answers_refused: Family<ViaLabel, Counter>,
    /// Answers to questions this gateway heard announced: no read of the question from Redis.
    pub answers_heard: Counter,
    /// Answers that reached this gateway before their question was heard, and waited for it
    /// (`DELTA_QUESTION_WAIT_MS`), by whether it was heard in time.
    pub answers_waited: Family<HeardLabel, Counter>,
    /// Answers waiting for their question to be heard now.
    pub answers_waiting: Gauge,
    /// Questions heard announced and kept (`DELTA_QUESTION_CACHE_MIB`), and their bytes.
    pub questions_heard: Gauge,
    pub questions_heard_bytes: Gauge,
    pub timeouts_applied: Counter,
    pub resumes_republished: Counter,
    /// What the note writer wrote, and dropped because the job was acknowledged first (`notes.rs`).
    pub notes: crate::notes::Counters,
    pub jobs_requeued: Counter,
    /// Finished runs deleted by this gateway's retention reconciler.
    pub runs_purged: Counter,
    /// Connections closed at once because `DELTA_MAX_CONNECTIONS` were open.
    pub connections_refused: Counter,
    /// Webhook events delivered (2xx) by this gateway.
    pub webhook_deliveries: Counter,
    /// Webhook attempts that failed (a status other than 2xx, a transport error, a timeout).
    pub webhook_failures: Counter,
    /// Subscriptions this gateway disabled after `DELTA_WEBHOOK_DISABLE_AFTER` of failures.
    pub webhooks_disabled: Counter,
    /// From a question being asked to its answer being accepted.
    pub time_to_answer: Histogram,
    /// From an answer being accepted to a worker resuming the run.
    pub answer_to_resume: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("delta");
        let m = Self {
            registry: Mutex::new(Registry::default()),
            runs: Family::default(),
            pending_interactions: Gauge::default(),
            jobs_pending: Gauge::default(),
            jobs_in_flight: Gauge::default(),
            jobs_redelivered: Gauge::default(),
            jobs_dead_lettered: Gauge::default(),
            runs_submitted: Counter::default(),
            answers_accepted: Family::default(),
            answers_refused: Family::default(),
            answers_heard: Counter::default(),
            answers_waited: Family::default(),
            answers_waiting: Gauge::default(),
            questions_heard: Gauge::default(),
            questions_heard_bytes: Gauge::default(),
            timeouts_applied: Counter::default(),
            resumes_republished: Counter::default(),
            notes: crate::notes::Counters::default(),
            jobs_requeued: Counter::default(),
            runs_purged: Counter::default(),
            connections_refused: Counter::default(),
            webhook_deliveries: Counter::default(),
            webhook_failures: Counter::default(),
            webhooks_disabled: Counter::default(),
            // 1 s … ~4.5 h
            time_to_answer: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(1.0, 3.0, 10),
            ),
            // 0.5 ms … ~8 s
            answer_to_resume: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0005, 2.0, 15),
            ),
        };
        r.register("runs", "Runs by status", m.runs.clone());
        r.register(
            "interactions_pending",
            "Questions waiting for an answer",
            m.pending_interactions.clone(),
        );
        r.register(
            "jobs_pending",
            "Jobs waiting for a worker",
            m.jobs_pending.clone(),
        );
        r.register(
            "jobs_in_flight",
            "Jobs delivered and not yet acknowledged",
            m.jobs_in_flight.clone(),
        );
        r.register(
            "jobs_redelivered",
            "Jobs delivered more than once and not yet acknowledged",
            m.jobs_redelivered.clone(),
        );
        r.register(
            "jobs_dead_lettered",
            "Messages in the dead-letter stream",
            m.jobs_dead_lettered.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed at once: DELTA_MAX_CONNECTIONS were open",
            m.connections_refused.clone(),
        );
        r.register(
            "runs_submitted",
            "Runs submitted here",
            m.runs_submitted.clone(),
        );
        r.register(
            "answers_accepted",
            "Answers accepted here, by channel",
            m.answers_accepted.clone(),
        );
        r.register(
            "answers_refused",
            "Answers refused here, by channel",
            m.answers_refused.clone(),
        );
        r.register(
            "answers_heard",
            "Answers accepted here to questions this gateway heard announced (the question not read from Redis)",
            m.answers_heard.clone(),
        );
        r.register(
            "answers_waited",
            "Answers that reached this gateway before their question was heard and waited for it (DELTA_QUESTION_WAIT_MS), by whether it was heard in time",
            m.answers_waited.clone(),
        );
        r.register(
            "answers_waiting",
            "Answers waiting now for their question to be heard",
            m.answers_waiting.clone(),
        );
        r.register(
            "questions_heard",
            "Questions heard announced and kept in memory (DELTA_QUESTION_CACHE_MIB)",
            m.questions_heard.clone(),
        );
        r.register(
            "questions_heard_bytes",
            "What the questions kept in memory are counted as, in bytes",
            m.questions_heard_bytes.clone(),
        );
        r.register(
            "timeouts_applied",
            "Questions closed by their deadline here",
            m.timeouts_applied.clone(),
        );
        r.register(
            "resumes_republished",
            "Resume jobs published by the reconciler",
            m.resumes_republished.clone(),
        );
        r.register(
            "job_notes_written",
            "Notes of a published job's stream sequence written to Redis (its job was not acknowledged within a second)",
            m.notes.written.clone(),
        );
        r.register(
            "job_notes_unneeded",
            "Notes of a published job's stream sequence not written: its job was acknowledged within a second",
            m.notes.unneeded.clone(),
        );
        r.register(
            "jobs_requeued",
            "Lost jobs enqueued again by the reconciler",
            m.jobs_requeued.clone(),
        );
        r.register(
            "runs_purged",
            "Finished runs deleted by the retention reconciler (DELTA_RETENTION)",
            m.runs_purged.clone(),
        );
        r.register(
            "webhook_deliveries",
            "Webhook events delivered (2xx) by this gateway",
            m.webhook_deliveries.clone(),
        );
        r.register(
            "webhook_failures",
            "Webhook delivery attempts that failed here",
            m.webhook_failures.clone(),
        );
        r.register(
            "webhooks_disabled",
            "Webhook subscriptions disabled here after failing for DELTA_WEBHOOK_DISABLE_AFTER",
            m.webhooks_disabled.clone(),
        );
        r.register(
            "time_to_answer_seconds",
            "From a question being asked to its answer being accepted",
            m.time_to_answer.clone(),
        );
        r.register(
            "answer_to_resume_seconds",
            "From an answer being accepted to a worker resuming its run",
            m.answer_to_resume.clone(),
        );
        *m.registry.lock().unwrap_or_else(|p| p.into_inner()) = r;
        m
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A flood of probes costs one reading a period: the ones that come meanwhile, at once or
    /// while it is under way, get it; a later one reads again.
    #[tokio::test]
    async fn fresh_reads_once_a_period_however_many_ask() {
        let fresh = Fresh::new(std::time::Duration::from_millis(300));
        let reads = AtomicUsize::new(0);
        let read = || async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            reads.fetch_add(1, Ordering::SeqCst) + 1
        };
        let all = futures_util::future::join_all((0..50).map(|_| fresh.get(read))).await;
        assert!(all.iter().all(|&n| n == 1), "{all:?}");
        assert_eq!(fresh.get(read).await, 1);
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        tokio::time::sleep(std::time::Duration::from_millis(350)).await;
        assert_eq!(fresh.get(read).await, 2);
    }
}
