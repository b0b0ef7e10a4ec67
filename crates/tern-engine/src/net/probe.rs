//! The data plane of a path test: chunk frames of zeros sent and drained as a transfer's, and one core's hash and seal rates.

use std::io::{BufReader, BufWriter, Read, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::thread;
use std::time::{Duration, Instant};

use tern_proto::TestWhat;
use tern_proto::data::{ChunkHeader, chunk_data_len, max_data_frame};
use tern_proto::frame::{FrameHeader, HEADER_LEN};

use crate::faults::chunk_hash;
use crate::net::datastream::DataConn;
use crate::net::seal::{Sealer, TAG_LEN};
use crate::net::transport::random;
use crate::probe::Rate;

// ------------------------------------------------------------------------------------------
// The data plane: chunk frames of zeros, as a transfer's.

/// One data stream's sending or receiving state across steps (the seal's counter, the tag's
/// sequence number).
pub(crate) struct Lane {
    conn: DataConn,
    sealer: Option<Sealer>,
    seq: u64,
}

impl Lane {
    pub(crate) fn new(mut conn: DataConn) -> Self {
        let sealer = conn.sealer.take();
        Self { conn, sealer, seq: 0 }
    }
}

/// Sends chunk frames of zeros on `lane` until `stop`; the payload bytes sent. Each frame is
/// built, hashed and sealed (or tagged) as a transfer's sender does.
pub(crate) fn blast(lane: &mut Lane, chunk: u32, stop: &AtomicBool) -> std::io::Result<u64> {
    const PREFIX: usize = HEADER_LEN + ChunkHeader::LEN;
    let len = chunk as usize;
    let trailer = if lane.sealer.is_some() { TAG_LEN } else { 0 };
    let mut buf = vec![0u8; PREFIX + len + TAG_LEN];
    let mut out = BufWriter::with_capacity(256 << 10, &mut lane.conn.stream);
    let mut sent = 0u64;
    while !stop.load(Relaxed) {
        let data = &mut buf[PREFIX..PREFIX + len];
        // A sealed buffer holds ciphertext: zeros again, as a read would refill it.
        data.fill(0);
        let hash = chunk_hash(data);
        let mut header = ChunkHeader { flags: 0, file_id: 0, index: lane.seq, offset: 0, hash, tag: [0; 32] };
        if let Some(key) = &lane.conn.tag_key {
            header.tag = header.compute_tag(key, lane.seq);
        }
        lane.seq += 1;
        buf[..HEADER_LEN].copy_from_slice(&ChunkHeader::frame_header(len + trailer));
        buf[HEADER_LEN..PREFIX].copy_from_slice(&header.encode());
        let end = PREFIX + len;
        if let Some(s) = lane.sealer.as_mut() {
            let (aad, body) = buf[..end].split_at_mut(HEADER_LEN);
            let tag = s.seal(aad, body);
            buf[end..end + TAG_LEN].copy_from_slice(&tag);
        }
        out.write_all(&buf[..end + trailer])?;
        sent += len as u64;
    }
    out.flush()?;
    Ok(sent)
}

/// Reads chunk frames from `conn` until it ends, opening (or checking the tag of) and hashing
/// each as a transfer's receiver does, and counts their payload into `count`. A frame that
/// fails is the end of the stream (a test has nothing to repair).
pub(crate) fn drain(conn: DataConn, chunk: u32, count: Arc<AtomicU64>) {
    let mut lane = Lane::new(conn);
    let trailer = if lane.sealer.is_some() { TAG_LEN } else { 0 };
    let tag_key = lane.conn.tag_key;
    let mut r = BufReader::with_capacity(256 << 10, &mut lane.conn.stream);
    let mut buf = vec![0u8; ChunkHeader::LEN + chunk as usize + TAG_LEN];
    loop {
        let mut head = [0u8; HEADER_LEN];
        if r.read_exact(&mut head).is_err() {
            return;
        }
        let Ok(len) = FrameHeader::parse(head, max_data_frame(chunk)).and_then(|f| chunk_data_len(f, chunk, trailer)) else {
            tracing::debug!("path test: a malformed data frame; stream dropped");
            return;
        };
        let body = &mut buf[..ChunkHeader::LEN + len + trailer];
        if r.read_exact(body).is_err() {
            return;
        }
        if let Some(s) = lane.sealer.as_mut()
            && !s.open(&head, body)
        {
            tracing::debug!("path test: a data frame failed decryption; stream dropped");
            return;
        }
        let h = ChunkHeader::decode(body[..ChunkHeader::LEN].try_into().unwrap());
        if let Some(key) = &tag_key
            && !tern_proto::auth::proofs_equal(&h.compute_tag(key, lane.seq), &h.tag)
        {
            tracing::debug!("path test: a data frame failed authentication; stream dropped");
            return;
        }
        lane.seq += 1;
        if chunk_hash(&body[ChunkHeader::LEN..ChunkHeader::LEN + len]) != h.hash {
            tracing::debug!("path test: a chunk's hash did not match; stream dropped");
            return;
        }
        count.fetch_add(len as u64, Relaxed);
    }
}

/// Sends on every lane in `lanes` until `stop` (or `until`); the bytes sent in all.
pub(crate) fn blast_all(lanes: &mut [Lane], chunk: u32, stop: &AtomicBool, until: Option<Instant>) -> u64 {
    thread::scope(|s| {
        let hs: Vec<_> = lanes.iter_mut().map(|l| s.spawn(move || blast(l, chunk, stop).unwrap_or(0))).collect();
        if let Some(t) = until {
            thread::sleep(t.saturating_duration_since(Instant::now()));
            stop.store(true, Relaxed);
        }
        hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    })
}

/// What arrives on `count` in the window from a fifth of `millis` after `start` to its end
/// (slow start and the previous step's tail stay out of it).
pub(crate) fn window(count: &AtomicU64, start: Instant, millis: u32) -> Rate {
    let total = Duration::from_millis(millis as u64);
    thread::sleep((start + total / 5).saturating_duration_since(Instant::now()));
    let (b0, t0) = (count.load(Relaxed), Instant::now());
    thread::sleep((start + total).saturating_duration_since(Instant::now()));
    Rate::new(count.load(Relaxed) - b0, t0.elapsed())
}

// ------------------------------------------------------------------------------------------
// Local measurements (both sides).

/// One core's BLAKE3 (`Hash`) or AES-256-GCM seal (`Seal`) rate over 1 MiB buffers.
pub fn cpu_rate(what: TestWhat, millis: u32) -> Rate {
    let mut buf = vec![0x5au8; 1 << 20];
    let mut sealer = Sealer::new(&random());
    let start = Instant::now();
    let until = start + Duration::from_millis(millis as u64);
    let mut bytes = 0u64;
    while Instant::now() < until {
        match what {
            TestWhat::Seal => {
                std::hint::black_box(sealer.seal(b"header", &mut buf));
            }
            _ => {
                std::hint::black_box(blake3::hash(&buf));
            }
        }
        bytes += buf.len() as u64;
    }
    Rate::new(bytes, start.elapsed())
}

/// An established control channel to a path-test server, with the session key and the
/// server's feature bits (a local path's self-test: the in-process server's thread too).
pub struct Connected {
    pub reader: crate::net::control::CtrlReader,
    pub writer: crate::net::control::CtrlWriter,
    pub key: [u8; 32],
    pub features: u64,
    pub server: thread::JoinHandle<()>,
}
