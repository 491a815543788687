//! A packed journal entry's `z` as Redis returns it (docs/protocol.md#packed-journal-entries):
//! read as the stores read it. Whatever the bytes, no panic and nothing past the cap; what packs
//! unpacks to the same lines.
//!
//! Input: the field's bytes.
#![no_main]

use delta_store::redis::{MAX_UNPACKED_ENTRY, pack_entry, unpack_entry};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(lines) = unpack_entry(data) {
        assert!(lines.len() <= MAX_UNPACKED_ENTRY);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let packed = pack_entry(text).expect("text packs");
        assert_eq!(unpack_entry(&packed).as_deref(), Ok(text), "round trip");
    }
});
