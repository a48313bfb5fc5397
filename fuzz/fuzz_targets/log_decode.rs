//! The log record decoder on arbitrary bytes: never panics, and whatever it accepts
//! re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::log::record::{decode_frame, Frame};

fuzz_target!(|data: &[u8]| {
    let mut off = 0;
    while off < data.len() {
        match decode_frame(&data[off..]) {
            Frame::Record(rec, n) => {
                assert_eq!(rec.encode(), &data[off..off + n]);
                off += n;
            }
            Frame::Truncated | Frame::Bad(_) => break,
        }
    }
});
