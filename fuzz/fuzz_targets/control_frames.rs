//! Arbitrary bytes as a control stream: every frame must decode or fail cleanly, and whatever
//! decodes must re-encode to the same message.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tern_proto::{Control, FrameDecoder, limits};

fuzz_target!(|data: &[u8]| {
    let mut d = FrameDecoder::new(limits::MAX_CONTROL_FRAME);
    // Feed in two pieces to exercise partial frames.
    let split = data.first().map_or(0, |&b| b as usize % (data.len() + 1));
    d.push(&data[..split]);
    let mut frames = Vec::new();
    while let Ok(Some(f)) = d.next_frame() {
        frames.push(f);
    }
    d.push(&data[split..]);
    while let Ok(Some(f)) = d.next_frame() {
        frames.push(f);
    }
    for (t, body) in frames {
        if let Ok(msg) = Control::decode(t, &body) {
            let again = msg.encode();
            let back = Control::decode(again[4], &again[5..]).expect("re-encoded message decodes");
            assert_eq!(back, msg);
        }
    }
});
