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

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use delta_protocol::{InteractionRequest, RequestId};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

/// What an entry is counted as besides its announcement's bytes (its slot in the map, its place
/// in the order, the allocation's header).
const OVERHEAD: usize = 256;

/// A question heard, and the trace context of the run's span that asked it.
#[derive(Clone, Debug)]
pub struct HeardQuestion {
    pub request: InteractionRequest,
    pub traceparent: Option<String>,
}

/// The questions heard, bounded by their size.
pub struct Heard {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<RequestId, Entry>,
    /// Insertion order, with each entry's generation: a pair whose entry was replaced or
    /// dropped since is skipped (and compacted away once they pile up).
    order: VecDeque<(RequestId, u64)>,
    bytes: usize,
    next: u64,
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
    /// Keeps at most about `cap` bytes of questions; `0` keeps none.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            inner: Mutex::new(Inner::default()),
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
        self.insert(
            a.data.request_id,
            Arc::from(payload),
            payload.len() + OVERHEAD,
        );
        true
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
            match queue.stored_questions().await {
                Ok(questions) => {
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
        let heard = Heard::new(300);
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
        let heard = Heard::new(250);
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
        let heard = Heard::new(1 << 20);
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
        let heard = Heard::new(50);
        let q = question("big");
        keep(&heard, &q, 51);
        assert!(!heard.contains(q.0.request_id));
        let off = Heard::new(0);
        assert!(!off.is_on());
        keep(&off, &q, 1);
        assert!(!off.contains(q.0.request_id));
    }

    #[test]
    fn an_announcement_is_heard_with_its_trace_context() {
        let heard = Heard::new(1 << 20);
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
        let heard = Heard::new(1 << 20);
        assert!(heard.hear(&payload));
        assert_eq!(heard.len_and_bytes(), (1, payload.len() + OVERHEAD));
        assert_eq!(heard.get(q.request_id).expect("kept").request, q);
    }

    #[test]
    fn a_kept_announcement_that_does_not_decode_is_never_used() {
        let heard = Heard::new(1 << 20);
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
        let heard = Heard::new(1 << 20);
        assert!(!heard.hear(b"not json"));
        assert!(!heard.hear(br#"{"specversion":"1.0","data":{"run_id":"x"}}"#));
        assert_eq!(heard.len_and_bytes(), (0, 0));
    }
}
