//! The local mailbox: `response.txt` / `response.json` ingested for a pending request as
//! `delta run` does, then checked by the engine.
//!
//! Input: `<request selector><file selector><file bytes>`: the file is response.txt,
//! response.json, or both (split at the first 0xFF).
#![no_main]

use std::path::Path;

use delta_cli::mailbox::Mailbox;
use delta_fuzz::{assert_clear, check_and_assert, moment, request, split};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [req, which, body @ ..] = data else {
        return;
    };
    let q = request(*req);
    let mailbox = Mailbox::new(Path::new(".delta"));
    let (txt, json) = match which % 3 {
        0 => (Some(body), None),
        1 => (None, Some(body)),
        _ => {
            let (a, b) = split(body);
            (Some(a), Some(b))
        }
    };
    match mailbox.parse_answer(q, txt, json) {
        Ok(Some(resp)) => {
            assert_eq!(resp.request_id, q.request_id);
            check_and_assert(q, resp, moment(which >> 2));
        }
        Ok(None) => unreachable!("a file was given"),
        Err(e) => assert_clear(&e),
    }
});
