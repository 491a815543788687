//! An interaction response checked against its request, as the engine checks it.
//!
//! Input: `<selector byte><request JSON> 0xFF <response JSON>`. A request that does not parse is
//! replaced by a fixture (picked by the selector), so most inputs reach the validation itself.
#![no_main]

use delta_fuzz::{assert_clear, check_and_assert, moment, request, split};
use delta_protocol::{InteractionRequest, InteractionResponse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (req, resp) = split(rest);
    let q = match serde_json::from_slice::<InteractionRequest>(req) {
        Ok(q) => q,
        Err(e) => {
            assert_clear(&e);
            request(selector).clone()
        }
    };
    let mut resp = match serde_json::from_slice::<InteractionResponse>(resp) {
        Ok(r) => r,
        Err(e) => return assert_clear(&e),
    };
    // Half of the answers are made to name the request, so they reach the option rules.
    if selector & 0x80 != 0 {
        resp.request_id = q.request_id;
    }
    check_and_assert(&q, resp, moment(selector >> 3));
});
