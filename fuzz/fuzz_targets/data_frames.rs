//! Arbitrary bytes as a data stream: headers are bounded, chunk lengths never exceed the
//! negotiated chunk size, and hello messages decode or fail without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tern_proto::data::{ChunkHeader, DataHello, chunk_data_len, max_data_frame};
use tern_proto::frame::{FrameHeader, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN + 1 {
        return;
    }
    let chunk_size = 64 << 10 << (data[0] % 8);
    let head: [u8; HEADER_LEN] = data[1..1 + HEADER_LEN].try_into().unwrap();
    let rest = &data[1 + HEADER_LEN..];
    if let Ok(h) = FrameHeader::parse(head, max_data_frame(chunk_size)) {
        for trailer in [0, 16] {
            if let Ok(n) = chunk_data_len(h, chunk_size, trailer) {
                assert!(n <= chunk_size as usize);
            }
        }
    }
    let _ = DataHello::decode(rest);
    if rest.len() >= ChunkHeader::LEN {
        let hdr = ChunkHeader::decode(rest[..ChunkHeader::LEN].try_into().unwrap());
        assert_eq!(ChunkHeader::decode(&hdr.encode()), hdr);
    }
});
