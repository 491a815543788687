//! Journal text (`journal.jsonl`, or a page read back from Redis), parsed from a first `seq` and
//! replayed, as the stores and the engine do.
//!
//! Input: `<first seq selector><text>`.
#![no_main]

use delta_fuzz::assert_clear;
use delta_protocol::journal::{Replay, parse_jsonl_from, to_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    // Mostly from 1 (a whole journal), sometimes a later page (from 2 to 56), rarely near the end
    // of u64.
    let first = match selector {
        0..=199 => 1,
        200..=254 => u64::from(selector - 198),
        255 => u64::MAX - 1,
    };
    // Files are read as UTF-8; Redis entries are decoded lossily before they get here.
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let parsed = match parse_jsonl_from(text, first) {
        Ok(p) => p,
        Err(e) => return assert_clear(&e),
    };
    if let Some(cut) = parsed.torn_tail_at {
        assert!(text.is_char_boundary(cut));
        let again = parse_jsonl_from(&text[..cut], first).expect("the part before a torn tail");
        assert_eq!(again.events, parsed.events);
        assert_eq!(again.torn_tail_at, None);
    }
    for e in &parsed.events {
        let line = to_line(e);
        let back = parse_jsonl_from(&line, e.seq).expect("a written line parses");
        assert_eq!(
            back.events.as_slice(),
            std::slice::from_ref(e),
            "round trip"
        );
    }
    let replay = Replay::new(&parsed.events);
    let _ = replay.next_call();
    let _ = replay.pending();
    let _ = replay.implied_status();
    let _ = replay.terminal();
    let _ = replay.plan_confirmation();
    let _ = replay.revising();
    if let Some(last) = parsed.events.last() {
        assert_eq!(replay.last_seq, last.seq);
    }
});
