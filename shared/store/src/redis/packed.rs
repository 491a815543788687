//! Packed journal entries (journal format [`super::JOURNAL_FORMAT_PACKED`]): a write's events, one
//! JSON line each as in a plain entry's `b`, deflated (raw deflate, RFC 1951) with a preset
//! dictionary of the events' own JSON (`journal-dictionary-1.txt`). A small write's lines are
//! mostly field names and event types, which the dictionary holds: a paused run's journal packs
//! to about a third of its size (docs/protocol.md#packed-journal-entries).
//!
//! The dictionary is part of the stored format: a packed entry can only be read with the very
//! bytes it was packed with, so `journal-dictionary-1.txt` never changes (a test holds its
//! digest). A better dictionary would be a new field name (`z2`) and a new journal format.

use std::cell::RefCell;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The preset dictionary of field `z`.
pub(crate) const DICTIONARY_1: &[u8] = include_bytes!("journal-dictionary-1.txt");

/// A packed entry unpacks to at most this much: events are small, and a corrupt or hostile
/// entry must not make a reader allocate without end.
pub const MAX_UNPACKED: usize = 64 << 20;

/// The compression level: 1. On a 1 KB write with the dictionary, zlib-rs takes about 7 µs at
/// level 1 and 14 at its default 6, whose output is about a fifth smaller (286 and 233 bytes):
/// every write a worker makes pays the time, so the fast level.
const LEVEL: u32 = 1;

thread_local! {
    // A deflater's state is about 256 KB: made once per thread, reset for each entry.
    static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new(Compression::new(LEVEL), false));
    static INFLATE: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

/// `lines` (a write's events, one JSON line each, joined by `\n`), packed; `None` should the
/// deflater refuse (it does not on a fresh stream: the write then goes in a plain entry).
pub fn pack(lines: &str) -> Option<Vec<u8>> {
    DEFLATE.with(|d| {
        let mut d = d.borrow_mut();
        d.reset();
        d.set_dictionary(DICTIONARY_1).ok()?;
        let mut out = Vec::with_capacity(lines.len() / 2 + 64);
        let mut input = lines.as_bytes();
        loop {
            let before_in = d.total_in();
            let status = d
                .compress_vec(input, &mut out, FlushCompress::Finish)
                .ok()?;
            let used = usize::try_from(d.total_in() - before_in).unwrap_or(input.len());
            input = &input[used.min(input.len())..];
            match status {
                Status::StreamEnd => return Some(out),
                Status::Ok | Status::BufError => out.reserve(out.capacity().max(256)),
            }
        }
    })
}

/// The lines of packed entry `blob`, or why they cannot be read.
pub fn unpack(blob: &[u8]) -> Result<String, String> {
    INFLATE.with(|i| {
        let mut i = i.borrow_mut();
        i.reset(false);
        i.set_dictionary(DICTIONARY_1)
            .map_err(|e| format!("its dictionary: {e}"))?;
        // Room for what a write's lines usually pack to, grown by steps so that the output
        // never passes the cap by more than a step's worth.
        let mut out: Vec<u8> = Vec::new();
        let mut input = blob;
        loop {
            let room = (blob.len() * 4 + 256).clamp(256, 1 << 20);
            let left = (MAX_UNPACKED + 1).saturating_sub(out.len());
            if left == 0 {
                return Err(format!("it unpacks to more than {MAX_UNPACKED} bytes"));
            }
            out.reserve_exact(room.min(left));
            let (before_in, before_out) = (i.total_in(), i.total_out());
            let status = i
                .decompress_vec(input, &mut out, FlushDecompress::Finish)
                .map_err(|e| format!("not deflate data: {e}"))?;
            let used = usize::try_from(i.total_in() - before_in).unwrap_or(input.len());
            let made = i.total_out() - before_out;
            input = &input[used.min(input.len())..];
            if out.len() > MAX_UNPACKED {
                return Err(format!("it unpacks to more than {MAX_UNPACKED} bytes"));
            }
            match status {
                Status::StreamEnd => break,
                // Nothing more came of the whole input: it ends before its last block.
                _ if used == 0 && made == 0 && out.len() < out.capacity() => {
                    return Err("it ends before its last block".into());
                }
                _ => {}
            }
        }
        String::from_utf8(out).map_err(|_| "its lines are not UTF-8".to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of the benchmark's paused run, as the engine writes them.
    const LINES: &str = concat!(
        r#"{"type":"ENGINE_START","payload":{"run_id":"01a210b8-5762-724c-a4a6-638f1b5ca4b9","agent":"hitl-basic","task":"t1","worker":"worker-a531979f9092","attempt":1}}"#,
        "\n",
        r#"{"type":"THOUGHT","payload":{"content":"run t1: starting"}}"#,
        "\n",
        r#"{"type":"THOUGHT","payload":{"content":"Calling echo","tool_calls":[{"id":"a2-1","tool":"echo","args":{"text":"run t1 step 2"}}]}}"#,
        "\n",
        r#"{"type":"ACTION_REQUEST","payload":{"action_id":"a2-1","tool":"echo","args":{"text":"run t1 step 2"}}}"#,
    );

    #[test]
    fn what_is_packed_unpacks_to_the_same_lines_and_smaller() {
        for lines in [LINES, "", "é\n{}", &"x".repeat(300_000)] {
            let packed = pack(lines).expect("packed");
            assert_eq!(unpack(&packed).as_deref(), Ok(lines));
        }
        let packed = pack(LINES).expect("packed");
        assert!(
            packed.len() * 2 < LINES.len(),
            "{} of {} bytes",
            packed.len(),
            LINES.len()
        );
    }

    #[test]
    fn the_dictionary_never_changes() {
        use std::fmt::Write;
        // FNV-1a 64 of the file: entries packed with it are only readable with these bytes.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in DICTIONARY_1 {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut hex = String::new();
        let _ = write!(hex, "{h:016x}");
        assert_eq!(
            (DICTIONARY_1.len(), hex.as_str()),
            (2567, "da3a23d5ca4f66e9")
        );
    }

    #[test]
    fn what_is_not_a_packed_entry_is_refused_without_a_panic() {
        let packed = pack(LINES).expect("packed");
        assert!(unpack(&packed[..packed.len() / 2]).is_err(), "cut short");
        assert!(unpack(b"").is_err());
        assert!(unpack(b"\xff\xff\xff\xff garbage").is_err());
        let mut flipped = packed.clone();
        flipped[3] ^= 0x55;
        // Either refused or something other than the lines: never a panic.
        assert_ne!(unpack(&flipped).ok().as_deref(), Some(LINES));
        // A bomb: more zeros than the cap pack small, and are refused at the cap.
        let zeros = "0".repeat(MAX_UNPACKED + 1024);
        let bomb = pack(&zeros).expect("packed");
        assert!(bomb.len() < 1 << 20);
        match unpack(&bomb) {
            Err(why) => assert!(why.contains("more than"), "{why}"),
            Ok(lines) => panic!("{} bytes unpacked past the cap", lines.len()),
        }
    }
}
