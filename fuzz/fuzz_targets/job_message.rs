//! A job message from NATS (`delta.jobs.<agent>`), decoded as the workers decode it.
#![no_main]

use delta_fuzz::assert_clear;
use delta_protocol::Job;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Job::decode(data) {
        Ok(job) => {
            let bytes = serde_json::to_vec(&job).expect("a job serialises");
            assert_eq!(Job::decode(&bytes), Ok(job.clone()), "round trip");
            assert!(job.msg_id().contains(':'));
        }
        Err(e) => assert_clear(&e),
    }
});
