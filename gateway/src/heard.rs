//! The questions this gateway heard announced (`requested`, as the events stream stores them),
//! kept in memory up to
//! `DELTA_QUESTION_CACHE_MIB` so that an answer to one of them needs no read of the question
//! from Redis, and no check that it was announced (docs/architecture.md "Answers to questions
//! the gateway heard").
//!
//! What is kept is what the question's worker stored before it announced it: a question is
//! never changed once asked (a reopened one is the same question), and only the roles that
//! write questions to Redis, workers and gateways, may publish on `requested` (docs/security.md).
//! They are read from the events stream (an ordered consumer), not heard as they are sent: a
//! question kept is one the stream holds, so it was announced.
//! What a question gains after it is asked (a claim, votes, responders added by an escalation,
//! its settling) is not here: the answer path uses this copy only for questions that take no
//! votes and have no escalation, the settling script in Redis still refuses an answer to a
//! question that is settled or claimed by someone else, and any refusal on this path is decided
//! again the usual way, with the question read from Redis.
//!
//! Each is kept as its announcement's bytes, and counted as those bytes and a fixed overhead;
//! it is decoded again when it is answered. Oldest first out past the cap; an entry is dropped
//! once its question is answered here.
//! Answers to questions answered through another gateway, or expired, leave their entries until
//! they are pushed out: a stale entry costs only the usual path.
//!
//! An answer can reach the gateway before the question does (a bot answering the instant it hears
//! the question on NATS, where the gateway hears it only once the events stream has stored it and
//! its consumer delivered it). Such an answer waits for the hearing, up to
//! `DELTA_QUESTION_WAIT_MS`, if its question may yet be heard: one asked (by the time in its
//! id) in the last few seconds, and since this gateway's consumer was made. Any other goes the
//! usual way at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use delta_protocol::{InteractionRequest, RequestId};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

/// What an entry is counted as besides its announcement's bytes (its slot in the map, its place
/// in the order, the allocation's header).
const OVERHEAD: usize = 256;

/// How old a question may be (by the time in its id) for an answer to wait for its hearing: one
/// asked longer ago than this and not heard will not be (its announcement was lost, or it was
/// asked before this gateway listened), or came from a clock far from this one's.
const RECENT: Duration = Duration::from_secs(5);

/// A question heard, and the trace context of the run's span that asked it.
#[derive(Clone, Debug)]
pub struct HeardQuestion {
    pub request: InteractionRequest,
    pub traceparent: Option<String>,
}

/// The questions heard, bounded by their size.
pub struct Heard {
    cap: usize,
    /// How long an answer to a question not heard yet waits for its hearing.
    wait: Duration,
    inner: Mutex<Inner>,
    /// Since when the events stream's consumer has been delivering, or `None` while there is none.
    listening_since: Mutex<Option<SystemTime>>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<RequestId, Entry>,
    /// Insertion order, with each entry's generation: a pair whose entry was replaced or
    /// dropped since is skipped (and compacted away once they pile up).
    order: VecDeque<(RequestId, u64)>,
    bytes: usize,
    next: u64,
    /// Answers waiting for their question to be heard, woken when it is (kept or not).
    waiting: HashMap<RequestId, Vec<tokio::sync::oneshot::Sender<()>>>,
    /// Questions heard and no longer kept (answered here, or pushed out) in the last [`RECENT`],
    /// oldest first, with when: an answer to one of them (a repeat, a client's retry) must not
    /// wait for a hearing that came already.
    let_go: VecDeque<(std::time::Instant, RequestId)>,
    let_go_ids: std::collections::HashSet<RequestId>,
}

/// The most questions [`Inner::let_go`] remembers (about 13,000 answers a second for
/// [`RECENT`]); past it, the oldest are forgotten first.
const LET_GO_MAX: usize = 65_536;

impl Inner {
    /// Remembers that question `id`, heard, is no longer kept.
    fn let_go(&mut self, id: RequestId) {
        let now = std::time::Instant::now();
        while let Some(&(at, old)) = self.let_go.front() {
            if now.duration_since(at) <= RECENT && self.let_go.len() < LET_GO_MAX {
                break;
            }
            self.let_go.pop_front();
            self.let_go_ids.remove(&old);
        }
        if self.let_go_ids.insert(id) {
            self.let_go.push_back((now, id));
        }
    }
}

/// Takes a waiting answer's sender out of [`Inner::waiting`] when its wait ends.
struct Leave<'a> {
    heard: &'a Heard,
    id: RequestId,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut g = self.heard.lock();
        if let Some(w) = g.waiting.get_mut(&self.id) {
            w.retain(|tx| !tx.is_closed());
            if w.is_empty() {
                g.waiting.remove(&self.id);
            }
        }
    }
}

/// A question kept as the announcement's bytes, decoded again when it is answered: what is
/// kept is then what is counted (a decoded question can take many times its text, a long
/// array of tool arguments say), and decoding costs microseconds beside the read it saves.
struct Entry {
    announcement: Arc<[u8]>,
    size: usize,
    generation: u64,
}

impl Heard {
    /// Keeps at most about `cap` bytes of questions (`0` keeps none); an answer to a question
    /// not heard yet waits up to `wait` for it (`0`: none waits).
    pub fn new(cap: usize, wait: Duration) -> Self {
        Self {
            cap,
            wait,
            inner: Mutex::new(Inner::default()),
            listening_since: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether it keeps anything at all.
    pub fn is_on(&self) -> bool {
        self.cap > 0
    }

    /// Keeps the question an announcement carries (the payload of a `requested` message),
    /// read only as far as its id: it is decoded whole if it is answered. Anything without a
    /// question's id is ignored: false (and a kept one that does not decode is never used).
    pub fn hear(&self, payload: &[u8]) -> bool {
        /// The one field of an announcement that keeping it needs.
        #[derive(serde::Deserialize)]
        struct Announcement {
            data: Asked,
        }
        #[derive(serde::Deserialize)]
        struct Asked {
            request_id: RequestId,
        }
        let Ok(a) = serde_json::from_slice::<Announcement>(payload) else {
            return false;
        };
        let id = a.data.request_id;
        self.insert(id, Arc::from(payload), payload.len() + OVERHEAD);
        self.wake(id);
        true
    }

    /// Wakes the answers waiting for question `id`: it was heard (and kept, unless larger than
    /// the cap).
    fn wake(&self, id: RequestId) {
        let waiting = self.lock().waiting.remove(&id);
        for w in waiting.into_iter().flatten() {
            let _ = w.send(());
        }
    }

    /// Waits, for an answer to question `id`, until the question is heard or this gateway's
    /// wait is over, if it may yet be heard (see the module's notes): `None` if the answer did
    /// not wait (heard already, or not to be heard), else whether the question was heard.
    pub async fn heard_soon(&self, id: RequestId) -> Option<bool> {
        if self.wait.is_zero() || !self.may_yet_hear(id, SystemTime::now()) {
            return None;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut g = self.lock();
            if g.by_id.contains_key(&id) || g.let_go_ids.contains(&id) {
                return None;
            }
            g.waiting.entry(id).or_default().push(tx);
        }
        // Whatever ends the wait (the hearing, the time, the answer's request dropped), the
        // waiter leaves no sender behind.
        let _leave = Leave { heard: self, id };
        let heard = matches!(tokio::time::timeout(self.wait, rx).await, Ok(Ok(())));
        Some(heard)
    }

    /// Whether question `id` may yet be heard at `now`: asked, by the time in its id, within
    /// [`RECENT`] of `now`, and no sooner than this gateway's consumer began delivering (it
    /// delivers only what the stream stores from then on).
    fn may_yet_hear(&self, id: RequestId, now: SystemTime) -> bool {
        let Some(since) = *self
            .listening_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        else {
            return false;
        };
        let Some((secs, nanos)) = id.as_uuid().get_timestamp().map(|t| t.to_unix()) else {
            return false;
        };
        let asked = SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
        let recent = match now.duration_since(asked) {
            Ok(age) => age <= RECENT,
            // Asked "later" than now: another machine's clock, a little ahead.
            Err(e) => e.duration() <= RECENT,
        };
        recent && asked >= since
    }

    /// The number of answers waiting for their question to be heard.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.values().map(Vec::len).sum()
    }

    fn set_listening(&self, since: Option<SystemTime>) {
        *self
            .listening_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = since;
    }

    /// Keeps the announcement of question `id`, counted as `size` bytes, pushing the oldest
    /// out past the cap.
    fn insert(&self, id: RequestId, announcement: Arc<[u8]>, size: usize) {
        if size > self.cap {
            return;
        }
        let mut g = self.lock();
        let inner = &mut *g;
        let generation = inner.next;
        inner.next += 1;
        if let Some(old) = inner.by_id.insert(
            id,
            Entry {
                announcement,
                size,
                generation,
            },
        ) {
            inner.bytes -= old.size;
        }
        inner.bytes += size;
        inner.order.push_back((id, generation));
        while inner.bytes > self.cap {
            let Some((old, generation)) = inner.order.pop_front() else {
                break;
            };
            if inner
                .by_id
                .get(&old)
                .is_some_and(|e| e.generation == generation)
                && let Some(e) = inner.by_id.remove(&old)
            {
                inner.bytes -= e.size;
                inner.let_go(old);
            }
        }
        // Pairs of entries dropped by `forget` are skipped above; never more of them than of
        // entries kept (plus some slack), so the order stays as small as what it orders.
        if inner.order.len() > 2 * inner.by_id.len() + 1024 {
            let by_id = &inner.by_id;
            inner
                .order
                .retain(|(id, g)| by_id.get(id).is_some_and(|e| e.generation == *g));
        }
    }

    /// The question `id`, if heard and still kept (decoded outside the lock).
    pub fn get(&self, id: RequestId) -> Option<HeardQuestion> {
        let announcement = self.lock().by_id.get(&id).map(|e| e.announcement.clone())?;
        let event = delta_protocol::events::decode::<InteractionRequest>(&announcement).ok()?;
        (event.data.request_id == id).then_some(HeardQuestion {
            request: event.data,
            traceparent: event.traceparent,
        })
    }

    /// Whether question `id` was heard announced (and is still kept).
    pub fn contains(&self, id: RequestId) -> bool {
        self.lock().by_id.contains_key(&id)
    }

    /// Drops question `id` (answered here).
    pub fn forget(&self, id: RequestId) {
        let mut g = self.lock();
        if let Some(e) = g.by_id.remove(&id) {
            g.bytes -= e.size;
            g.let_go(id);
        }
    }

    /// The questions kept, and their bytes as counted.
    pub fn len_and_bytes(&self) -> (usize, usize) {
        let g = self.lock();
        (g.by_id.len(), g.bytes)
    }

    /// Hears every `requested` announcement the events stream stores from now on, until
    /// `shutdown`; its consumer is made again should it end (NATS restarted, say).
    pub async fn listen(&self, queue: &delta_queue::Queue, shutdown: CancellationToken) {
        loop {
            // From before the consumer is made: a question asked in between and stored before
            // it began may make one answer wait in vain, once.
            let since = SystemTime::now();
            match queue.stored_questions().await {
                Ok(questions) => {
                    self.set_listening(Some(since));
                    let mut questions = std::pin::pin!(questions);
                    loop {
                        tokio::select! {
                            q = questions.next() => match q {
                                Some(payload) => {
                                    if !self.hear(&payload) {
                                        tracing::debug!("ignoring an announcement that is not a question");
                                    }
                                }
                                None => break,
                            },
                            () = shutdown.cancelled() => return,
                        }
                    }
                    self.set_listening(None);
                }
                Err(e) => {
                    // Answers read their questions from Redis meanwhile, as with the cache off.
                    tracing::warn!(error = %delta_host::Chain(&e), "not hearing questions announced; trying again in 5 s");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{InteractionType, RunId};

    /// A question and its announcement.
    fn question(prompt: &str) -> (InteractionRequest, Arc<[u8]>) {
        let q = InteractionRequest::new(RunId::new(), "agent", InteractionType::UserInput, prompt);
        let announcement = delta_protocol::events::encode(&delta_protocol::events::requested(
            "delta", &q, None, None,
        ));
        (q, Arc::from(announcement.as_slice()))
    }

    /// Keeps `q`'s announcement, counted as `size` bytes.
    fn keep(heard: &Heard, q: &(InteractionRequest, Arc<[u8]>), size: usize) {
        heard.insert(q.0.request_id, q.1.clone(), size);
    }

    #[test]
    fn the_oldest_questions_go_first_past_the_cap() {
        let heard = Heard::new(300, Duration::ZERO);
        let qs: Vec<_> = (0..4).map(|i| question(&format!("q{i}"))).collect();
        for q in &qs {
            keep(&heard, q, 100);
        }
        let kept: Vec<bool> = qs.iter().map(|q| heard.contains(q.0.request_id)).collect();
        assert_eq!(kept, [false, true, true, true]);
        assert_eq!(heard.len_and_bytes(), (3, 300));
        let got = heard.get(qs[3].0.request_id).expect("kept");
        assert_eq!(got.request, qs[3].0);
    }

    #[test]
    fn a_question_heard_again_is_counted_once_and_kept_as_new() {
        let heard = Heard::new(250, Duration::ZERO);
        let (a, b, c) = (question("a"), question("b"), question("c"));
        keep(&heard, &a, 100);
        keep(&heard, &b, 100);
        // `a` again (a redelivered job announces its question again): now the newest.
        keep(&heard, &a, 100);
        assert_eq!(heard.len_and_bytes(), (2, 200));
        keep(&heard, &c, 100);
        assert!(heard.contains(a.0.request_id));
        assert!(!heard.contains(b.0.request_id));
        assert!(heard.contains(c.0.request_id));
        assert_eq!(heard.len_and_bytes(), (2, 200));
    }

    #[test]
    fn forgotten_questions_free_their_bytes_and_leave_no_trail() {
        let heard = Heard::new(1 << 20, Duration::ZERO);
        for i in 0..10_000 {
            let q = question(&format!("q{i}"));
            keep(&heard, &q, 100);
            heard.forget(q.0.request_id);
        }
        assert_eq!(heard.len_and_bytes(), (0, 0));
        // Compacted once it passes twice the entries kept (one, as each is inserted) plus 1,024.
        assert!(heard.lock().order.len() <= 2 + 1024);
    }

    #[test]
    fn a_question_larger_than_the_cap_is_not_kept_and_a_zero_cap_keeps_none() {
        let heard = Heard::new(50, Duration::ZERO);
        let q = question("big");
        keep(&heard, &q, 51);
        assert!(!heard.contains(q.0.request_id));
        let off = Heard::new(0, Duration::ZERO);
        assert!(!off.is_on());
        keep(&off, &q, 1);
        assert!(!off.contains(q.0.request_id));
    }

    #[test]
    fn an_announcement_is_heard_with_its_trace_context() {
        let heard = Heard::new(1 << 20, Duration::ZERO);
        let q = question("deploy?").0;
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let event = delta_protocol::events::requested("delta", &q, None, Some(tp));
        assert!(heard.hear(&delta_protocol::events::encode(&event)));
        let got = heard.get(q.request_id).expect("heard");
        assert_eq!(got.request, q);
        assert_eq!(got.traceparent.as_deref(), Some(tp));
    }

    #[test]
    fn a_question_is_counted_as_the_bytes_kept_however_large_it_decodes() {
        // Tool arguments of 20,000 numbers: about 40 KB of text, many times that decoded.
        let mut q = question("approve?").0;
        q.context
            .insert("args".into(), serde_json::json!(vec![0; 20_000]));
        let payload = delta_protocol::events::encode(&delta_protocol::events::requested(
            "delta", &q, None, None,
        ));
        let heard = Heard::new(1 << 20, Duration::ZERO);
        assert!(heard.hear(&payload));
        assert_eq!(heard.len_and_bytes(), (1, payload.len() + OVERHEAD));
        assert_eq!(heard.get(q.request_id).expect("kept").request, q);
    }

    #[test]
    fn a_kept_announcement_that_does_not_decode_is_never_used() {
        let heard = Heard::new(1 << 20, Duration::ZERO);
        let id = RequestId::new();
        let payload = format!(r#"{{"specversion":"1.0","data":{{"request_id":"{id}"}}}}"#);
        assert!(heard.hear(payload.as_bytes()));
        assert!(heard.contains(id));
        assert!(
            heard.get(id).is_none(),
            "not a question: answered the usual way"
        );
    }

    #[test]
    fn only_a_question_announcement_is_heard() {
        let heard = Heard::new(1 << 20, Duration::ZERO);
        assert!(!heard.hear(b"not json"));
        assert!(!heard.hear(br#"{"specversion":"1.0","data":{"run_id":"x"}}"#));
        assert_eq!(heard.len_and_bytes(), (0, 0));
    }

    /// A gateway that waits `wait` for questions, listening since a second ago.
    fn listening(cap: usize, wait: Duration) -> Heard {
        let heard = Heard::new(cap, wait);
        heard.set_listening(Some(SystemTime::now() - Duration::from_secs(1)));
        heard
    }

    #[tokio::test]
    async fn an_answer_before_its_question_waits_and_is_woken_by_the_hearing() {
        // A minute's wait: were the hearing not to wake it, the test would take that long and
        // fail on `Some(false)`.
        let heard = listening(1 << 20, Duration::from_secs(60));
        let q = question("deploy?");
        let hearing = async {
            while heard.waiting() == 0 {
                tokio::task::yield_now().await;
            }
            assert!(heard.hear(&q.1));
        };
        let (waited, ()) = tokio::join!(heard.heard_soon(q.0.request_id), hearing);
        assert_eq!(waited, Some(true));
        assert_eq!(heard.get(q.0.request_id).expect("kept").request, q.0);
        assert_eq!(heard.waiting(), 0);
        // Heard already: the next answer does not wait.
        assert_eq!(heard.heard_soon(q.0.request_id).await, None);
    }

    #[tokio::test]
    async fn an_answer_waits_no_longer_than_the_gateways_wait_and_leaves_nothing_behind() {
        let heard = listening(1 << 20, Duration::from_millis(1));
        let q = question("never announced");
        assert_eq!(heard.heard_soon(q.0.request_id).await, Some(false));
        assert_eq!(heard.waiting(), 0);
        assert!(heard.lock().waiting.is_empty());
        // An answer whose request is dropped while it waits leaves nothing either.
        let heard = listening(1 << 20, Duration::from_secs(60));
        let dropped =
            tokio::time::timeout(Duration::from_millis(1), heard.heard_soon(q.0.request_id)).await;
        assert!(dropped.is_err(), "still waiting when dropped");
        assert!(heard.lock().waiting.is_empty());
    }

    #[tokio::test]
    async fn an_answer_does_not_wait_for_a_question_this_gateway_cannot_hear() {
        let q = question("asked");
        let id = q.0.request_id;
        // No consumer, or none waits.
        assert_eq!(
            Heard::new(1 << 20, Duration::from_secs(60))
                .heard_soon(id)
                .await,
            None
        );
        assert_eq!(
            listening(1 << 20, Duration::ZERO).heard_soon(id).await,
            None
        );
        let heard = listening(1 << 20, Duration::from_secs(60));
        // Asked before the consumer was made: the consumer delivers only what comes after.
        heard.set_listening(Some(SystemTime::now() + Duration::from_secs(1)));
        assert_eq!(heard.heard_soon(id).await, None);
        heard.set_listening(Some(SystemTime::now() - Duration::from_secs(60)));
        // Asked more than five seconds ago, by the time in its id, or that far "ahead".
        let now = SystemTime::now();
        assert!(heard.may_yet_hear(id, now));
        assert!(!heard.may_yet_hear(id, now + RECENT + Duration::from_secs(1)));
        assert!(!heard.may_yet_hear(id, now - RECENT - Duration::from_secs(1)));
        // An id with no time in it (not made by a fleet).
        let v4: RequestId = uuid::Uuid::new_v4()
            .to_string()
            .parse()
            .expect("a request id");
        assert!(!heard.may_yet_hear(v4, now));
        // Kept already.
        assert!(heard.hear(&q.1));
        assert_eq!(heard.heard_soon(id).await, None);
        assert_eq!(heard.waiting(), 0);
    }

    #[tokio::test]
    async fn a_question_too_large_to_keep_still_wakes_its_answer() {
        let heard = listening(50, Duration::from_secs(60));
        let q = question("a question larger than fifty bytes, as any announcement is");
        let hearing = async {
            while heard.waiting() == 0 {
                tokio::task::yield_now().await;
            }
            assert!(heard.hear(&q.1));
        };
        let (waited, ()) = tokio::join!(heard.heard_soon(q.0.request_id), hearing);
        assert_eq!(waited, Some(true), "woken, to go the usual way at once");
        assert!(!heard.contains(q.0.request_id));
    }

    #[tokio::test]
    async fn an_answer_to_a_question_answered_or_pushed_out_here_does_not_wait() {
        // A minute's wait: an answer that waited would make the test take that long.
        let heard = listening(1 << 20, Duration::from_secs(60));
        let q = question("answered twice");
        assert!(heard.hear(&q.1));
        heard.forget(q.0.request_id);
        assert_eq!(heard.heard_soon(q.0.request_id).await, None);
        // Pushed out by newer ones past the cap.
        let small = listening(300, Duration::from_secs(60));
        let qs: Vec<_> = (0..4).map(|i| question(&format!("q{i}"))).collect();
        for q in &qs {
            keep(&small, q, 100);
        }
        assert!(!small.contains(qs[0].0.request_id));
        assert_eq!(small.heard_soon(qs[0].0.request_id).await, None);
        assert!(small.lock().let_go.len() <= LET_GO_MAX);
    }
}
