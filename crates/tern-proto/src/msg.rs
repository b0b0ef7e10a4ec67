//! Control messages: one enum, one encoder, one decoder with bounds on every field.

use crate::filter::{FilterRule, MAX_FILTER_RULES, MAX_PATTERN, RuleKind};
use crate::frame::encode_frame;
use crate::path::validate_relative;
use crate::wire::{Reader, Writer};
use crate::{ProtoError, limits};

/// Which end of the transfer an error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Destination,
    Network,
}

impl Side {
    fn from_u8(v: u8) -> Result<Self, ProtoError> {
        match v {
            0 => Ok(Side::Source),
            1 => Ok(Side::Destination),
            2 => Ok(Side::Network),
            _ => Err(ProtoError::Invalid { what: "side", why: "unknown value" }),
        }
    }
    fn to_u8(self) -> u8 {
        match self {
            Side::Source => 0,
            Side::Destination => 1,
            Side::Network => 2,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Destination => "destination",
            Side::Network => "network",
        }
    }
}

/// What the server does in a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Sender,
    Receiver,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// A further name of a file announced earlier; `target` is that file's path.
    HardLink,
}

/// One item of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: u64,
    pub kind: EntryKind,
    /// Relative path, validated by [`validate_relative`].
    pub path: Vec<u8>,
    pub size: u64,
    pub mode: u32,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    /// A symlink's target, a hard link's first name (a relative path), empty otherwise.
    pub target: Vec<u8>,
    /// Whole-file hash, sent only in `--checksum` mode.
    pub hash: Option<[u8; 32]>,
    /// A regular file of which only the bytes `start..end` move in this session (kind 4 on the
    /// wire, `FEATURE_STRIPES`): a stripe of a file spread over several node pairs. The receiver
    /// verifies that range into the file's shared partial and publishes nothing; the file is
    /// published by a later session of the whole file (docs/cluster.md "Stripes").
    pub stripe: Option<(u64, u64)>,
}

/// Transfer options carried in `Open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    pub flags: u32,
    pub chunk_size: u32,
    pub streams: u16,
    /// Files in flight at the receiver (0: its default).
    pub concurrency: u32,
}

macro_rules! flag {
    ($get:ident, $set:ident, $bit:expr) => {
        pub fn $get(&self) -> bool {
            self.flags & (1 << $bit) != 0
        }
        pub fn $set(&mut self, on: bool) {
            if on { self.flags |= 1 << $bit } else { self.flags &= !(1 << $bit) }
        }
    };
}

impl Options {
    flag!(preserve, set_preserve, 0);
    flag!(sync, set_sync, 1);
    flag!(checksum, set_checksum, 2);
    flag!(delete, set_delete, 3);
    flag!(dry_run, set_dry_run, 4);
    flag!(verify_full, set_verify_full, 5);
    flag!(no_encrypt, set_no_encrypt, 6);
    flag!(recursive, set_recursive, 7);
    flag!(contents, set_contents, 8);
    flag!(fsync_none, set_fsync_none, 9);
    // A third-party session: the sender's data streams go to another daemon (`Dial`), and the
    // receiver checks them against the stream ticket instead of its own session key.
    flag!(third_party, set_third_party, 10);
    // `--ignore-existing`: a destination file that exists is kept, whatever its content.
    flag!(ignore_existing, set_ignore_existing, 11);
    // `--safe-links`: the receiver leaves out links whose targets point outside the copied tree
    // (absolute, or climbing above it), as rsync does. An older receiver refused them instead.
    flag!(safe_links, set_safe_links, 12);
    // `--delete-empty-source`: `--delete` from an empty source empties the destination, as
    // rsync does. Without it the receiver refuses (an older receiver deleted silently).
    flag!(delete_from_empty, set_delete_from_empty, 13);
    // Further names of a multi-link file are announced as hard links (entry kind 3).
    flag!(hard_links, set_hard_links, 14);
}

/// The file id of a `FileError` about an entry the walk could not announce (missing,
/// unreadable, not a regular file): the receiver reports it and refuses `--delete`.
pub const UNANNOUNCED: u64 = u64::MAX;

/// Hello feature bit: this peer understands third-party sessions (`Dial`, option bit 10). A
/// client checks it on both daemons before starting one, so an older daemon fails with a clear
/// message instead of a protocol error or failing stream proofs.
pub const FEATURE_THIRD_PARTY: u64 = 1;
/// Hello feature bit: this peer applies include/exclude rules sent in `Filters`. A client with
/// rules refuses to go on without it: an older peer would silently copy (or delete) everything.
pub const FEATURE_FILTERS: u64 = 4;
/// Hello feature bit: this peer walks a list of paths sent in `FileList` (`--files-from`).
pub const FEATURE_FILE_LIST: u64 = 8;
/// Hello feature bit: this peer, as the receiver, honours option bit 11 (`--ignore-existing`).
/// An older receiver would ignore the bit and overwrite what the user meant to keep.
pub const FEATURE_IGNORE_EXISTING: u64 = 16;
/// Hello feature bit: this peer sends and answers `StreamReset`/`Resending`: a data stream whose
/// record fails authentication is dropped and its frames in flight sent again, instead of
/// failing the session (`docs/protocol.md`, "Repairing a corrupted data stream").
pub const FEATURE_STREAM_RESET: u64 = 32;
/// Hello feature bit: this peer sends (as the sender) and makes (as the receiver) hard links,
/// entry kind 3, when option bit 14 is set. An older peer would refuse the kind.
pub const FEATURE_HARD_LINKS: u64 = 64;
/// Hello feature bit: this peer answers `FsRequest` (`tern ls`, `stat`, `mkdir`, `rm`, remote
/// globs). A client refuses to send one to a peer without it, naming the upgrade.
pub const FEATURE_FS_OPS: u64 = 128;
/// Most entries one `FsRequest` is answered with in all (and directory entries a glob visits).
pub const MAX_FS_ENTRIES: usize = 1_000_000;
/// Most bytes of names and targets one answer carries in all (a million paths of 4 KiB would be
/// 4 GiB in a client's memory).
pub const MAX_FS_BYTES: usize = 256 << 20;
/// Bytes of names and targets a sender puts in one `FsEntries` (the frame is at most 1 MiB).
pub const FS_ENTRIES_BYTES: usize = 512 << 10;

/// What an `FsRequest` asks the server to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsOp {
    List,
    Stat,
    Mkdir,
    Remove,
    Glob,
}

impl FsOp {
    /// The command's name, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            FsOp::List => "ls",
            FsOp::Stat => "stat",
            FsOp::Mkdir => "mkdir",
            FsOp::Remove => "rm",
            FsOp::Glob => "glob",
        }
    }
    fn to_u8(self) -> u8 {
        match self {
            FsOp::List => 0,
            FsOp::Stat => 1,
            FsOp::Mkdir => 2,
            FsOp::Remove => 3,
            FsOp::Glob => 4,
        }
    }
    fn from_u8(v: u8) -> Result<Self, ProtoError> {
        Ok(match v {
            0 => FsOp::List,
            1 => FsOp::Stat,
            2 => FsOp::Mkdir,
            3 => FsOp::Remove,
            4 => FsOp::Glob,
            _ => return Err(ProtoError::Invalid { what: "file-system op", why: "unknown value" }),
        })
    }
}

/// `FsRequest` flag: list recursively (`ls -R`), remove a directory's tree (`rm -r`).
pub const FS_RECURSIVE: u8 = 1;
/// `FsRequest` flag: make missing parents, an existing directory is fine (`mkdir -p`).
pub const FS_PARENTS: u8 = 2;
/// `FsRequest` flag: a missing path is no error (`rm -f`).
pub const FS_FORCE: u8 = 4;

/// Hello feature bit: this peer answers `TestRequest` (`tern test`, docs/protocol.md "Path tests").
pub const FEATURE_PATH_TESTS: u64 = 256;
/// Hello feature bit: this peer answers `TestStep` what 4 (`TestWhat::Cpu`: its usable cores,
/// CPU quota included, and the CPU time its last carry used; docs/protocol.md "Path tests").
pub const FEATURE_TEST_CPU: u64 = 512;
/// Hello feature bit: this peer answers a path test's `host` step (`tern doctor DEST`).
pub const FEATURE_HOST_FACTS: u64 = 1024;
/// Hello feature bit: this daemon is a node of a cluster and answers `ClusterRequest` with its
/// live nodes (docs/cluster.md "Protocol additions").
pub const FEATURE_CLUSTER: u64 = 2048;
/// Hello feature bit: this peer sends a `Stripe` of a listed file (as the sender) and receives
/// a stripe entry (kind 4) into a shared partial without publishing it (as the receiver).
pub const FEATURE_STRIPES: u64 = 4096;
/// Hello feature bit: this peer reads a data stream's TLS records one at a time, so bytes sent
/// right behind `DataHello` (or `DataAccept`) stay raw; a client sends the go-ahead byte with
/// its `DataHello`. A server sends its certificate's pin in `Ready` to a client with this bit,
/// and such a client pushes chunks on a stream whose server presented that certificate without
/// waiting a round trip for `DataAccept` (docs/protocol.md, "Data stream frames").
pub const FEATURE_EARLY_GO: u64 = 8192;
/// Most nodes one `ClusterNodes` lists.
pub const MAX_CLUSTER_NODES: usize = 256;
/// Longest cluster name (`tern serve --cluster`).
pub const MAX_CLUSTER_NAME: usize = 64;
/// `TestRequest` flag: data streams carry no encryption (tagged frames, as `--no-encrypt`).
pub const TEST_NO_ENCRYPT: u8 = 1;
/// `TestRequest` flag: the server sends on the data streams (the client measures).
pub const TEST_PULL: u8 = 2;
/// Most data streams (and writers) a path test may use.
pub const MAX_TEST_STREAMS: u16 = 64;
/// Longest `TestStep`, in milliseconds; the shortest.
pub const MAX_TEST_STEP_MS: u32 = 20_000;
pub const MIN_TEST_STEP_MS: u32 = 100;

/// What a `TestStep` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestWhat {
    /// Memory→memory over the first `count` data streams.
    Carry,
    /// `count` writers on a scratch file in the destination directory.
    Write,
    /// One core's BLAKE3 rate.
    Hash,
    /// One core's AES-256-GCM seal rate.
    Seal,
    /// The server's usable cores (×1000 in `bytes`) and the CPU time its last carry used
    /// (`micros`); only to a peer with `FEATURE_TEST_CPU`.
    Cpu,
    /// The host's tuning facts (`FEATURE_HOST_FACTS`): the result's note, as `key value` lines.
    Host,
}

impl TestWhat {
    pub fn as_str(self) -> &'static str {
        match self {
            TestWhat::Carry => "carry",
            TestWhat::Write => "write",
            TestWhat::Hash => "hash",
            TestWhat::Seal => "seal",
            TestWhat::Cpu => "cpu",
            TestWhat::Host => "host",
        }
    }
    fn to_u8(self) -> u8 {
        self as u8
    }
    fn from_u8(v: u8) -> Result<Self, ProtoError> {
        Ok(match v {
            0 => TestWhat::Carry,
            1 => TestWhat::Write,
            2 => TestWhat::Hash,
            3 => TestWhat::Seal,
            4 => TestWhat::Cpu,
            5 => TestWhat::Host,
            _ => return Err(ProtoError::Invalid { what: "test step", why: "unknown value" }),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    File,
    Dir,
    Symlink,
    /// A fifo, socket or device.
    Other,
}

impl FsKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FsKind::File => "file",
            FsKind::Dir => "dir",
            FsKind::Symlink => "symlink",
            FsKind::Other => "other",
        }
    }
}

/// One entry of an `FsEntries` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsEntry {
    pub kind: FsKind,
    /// Relative to the listed directory (list), as requested (stat), or a matching path (glob).
    pub name: Vec<u8>,
    pub size: u64,
    /// `st_mode`, type bits included.
    pub mode: u32,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    /// Symlink target, empty otherwise.
    pub target: Vec<u8>,
}

/// Most paths one transfer's `FileList` messages may carry in all.
pub const MAX_FILE_LIST: usize = 1_000_000;
/// Most bytes of paths they may carry in all (a million paths of 4 KiB would be 4 GiB).
pub const MAX_FILE_LIST_BYTES: usize = 256 << 20;

/// Hello feature bit: this peer understands `Listening`. An ssh-mode server whose client set it
/// announces its data address right after its `Hello`, so the data streams connect while the
/// control channel still authenticates; a client accepts `Listening` only from a server that set
/// it. Both sides of this build set it.
pub const FEATURE_EARLY_DATA_ADDR: u64 = 2;

/// Longest data address in `Ready`, `Dial` and `Listening` (`host:port`).
pub const MAX_ADDR: usize = 256;

/// Chunks a receiver wants of one file: ranges of chunk indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantFile {
    pub id: u64,
    pub ranges: Vec<(u64, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    Identical,
    DryRun,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanAction {
    Copy,
    Skip,
    Delete,
}

/// Counters the receiver reports at the end of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    pub files_done: u64,
    pub files_failed: u64,
    pub bytes_written: u64,
    pub chunks_resent: u64,
    pub bytes_resent: u64,
    pub deleted: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Hello {
        min_version: u16,
        max_version: u16,
        features: u64,
    },
    Auth {
        nonce: [u8; 32],
        proof: [u8; 32],
    },
    Open {
        server_role: Role,
        options: Options,
        sources: Vec<Vec<u8>>,
        destination: Vec<u8>,
    },
    Ready {
        session_id: [u8; 16],
        data_addr: Vec<u8>,
        nonce: [u8; 32],
        /// BLAKE3 of the server's TLS certificate, sent only to a client with
        /// `FEATURE_EARLY_GO` (older clients refuse the trailing bytes).
        cert_pin: Option<[u8; 32]>,
    },
    Entries(Vec<Entry>),
    ManifestEnd {
        files: u64,
        bytes: u64,
    },
    Want(Vec<WantFile>),
    Skip(Vec<(u64, SkipReason)>),
    FileEnd {
        id: u64,
        file_hash: [u8; 32],
        size: u64,
        mtime_s: i64,
        mtime_ns: u32,
    },
    FileDone(Vec<u64>),
    FileError {
        id: u64,
        side: Side,
        message: String,
    },
    ChunkBad {
        id: u64,
        chunk: u64,
    },
    Summary(Summary),
    Fatal {
        side: Side,
        message: String,
    },
    Plan {
        action: PlanAction,
        path: Vec<u8>,
    },
    Bye,
    StreamCount(u16),
    /// Instead of `Open`: run the hook the daemon's operator registered under `name`, for the
    /// unit at `path` (a path in the daemon's namespace). Never a command: see `docs/watch.md`.
    Hook {
        name: String,
        path: Vec<u8>,
    },
    /// The hook's exit status (-1: killed by a signal) and the tail of its output.
    HookDone {
        status: i32,
        output: String,
    },
    /// After a third-party `Open` (server role sender): open the data streams to `addr` (the
    /// receiving daemon's data address) for its session `session_id`, proving them with `ticket`
    /// (derived from the receiver's session key, see `auth::stream_ticket`).
    Dial {
        addr: Vec<u8>,
        session_id: [u8; 16],
        ticket: [u8; 32],
    },
    /// ssh mode, right after the server's `Hello` (client set `FEATURE_EARLY_DATA_ADDR`): the
    /// address `Ready` will carry, sent early so the data streams connect during `Auth`/`Open`.
    Listening {
        data_addr: Vec<u8>,
    },
    /// Before `Open`: the include/exclude rules of this transfer, in order.
    Filters(Vec<FilterRule>),
    /// Before `Open`, repeated: paths under the source directory to copy instead of walking it.
    FileList(Vec<Vec<u8>>),
    /// Before `Open`, after the `FileList`, at most once (`FEATURE_STRIPES`): of the listed
    /// regular file `path`, only bytes `start..end` move in this session.
    Stripe {
        path: Vec<u8>,
        start: u64,
        end: u64,
    },
    /// Receiver → sender (`FEATURE_STREAM_RESET`): data stream `index` carried a record that
    /// failed authentication and is closed; the receiver accepted its first `received` chunk
    /// frames, the sender sends the rest again.
    StreamReset {
        index: u32,
        received: u64,
    },
    /// Receiver → sender (`FEATURE_STREAM_RESET`): chunk frame `seq` of data stream `index`
    /// failed authentication and was skipped; the stream goes on, the sender sends it again.
    RecordBad {
        index: u32,
        seq: u64,
    },
    /// Sender → receiver, the answer to `StreamReset` and `RecordBad`: what it queued again,
    /// for the summary.
    Resending {
        index: u32,
        chunks: u64,
        bytes: u64,
    },
    /// Instead of `Open` (`FEATURE_FS_OPS`): list, stat, mkdir, remove or glob `path`.
    FsRequest {
        op: FsOp,
        flags: u8,
        path: Vec<u8>,
    },
    /// Part of the answer to `FsRequest`.
    FsEntries(Vec<FsEntry>),
    /// The answer is complete: `count` entries in all.
    FsEnd {
        count: u64,
    },
    /// Instead of `Open` (`FEATURE_PATH_TESTS`): a path test with `streams` data streams.
    TestRequest {
        path: Vec<u8>,
        flags: u8,
        streams: u16,
        chunk_size: u32,
    },
    /// One measurement of a path test.
    TestStep {
        what: TestWhat,
        count: u16,
        millis: u32,
    },
    /// The answer to a `TestStep`: `bytes` in `micros`, or skipped (`note` says why).
    TestResult {
        what: TestWhat,
        skipped: bool,
        bytes: u64,
        micros: u64,
        note: String,
    },
    /// Instead of `Open` (`FEATURE_CLUSTER`): which nodes serve this daemon's cluster.
    ClusterRequest,
    /// The answer: the cluster's name and its nodes that take work now (this one included), as
    /// the `host:port` addresses clients reach their daemons at.
    ClusterNodes {
        cluster: String,
        nodes: Vec<Vec<u8>>,
    },
}

const MAGIC: &[u8; 4] = b"TERN";

impl Control {
    pub fn type_byte(&self) -> u8 {
        match self {
            Control::Hello { .. } => 1,
            Control::Auth { .. } => 2,
            Control::Open { .. } => 3,
            Control::Ready { .. } => 4,
            Control::Entries(_) => 5,
            Control::ManifestEnd { .. } => 6,
            Control::Want(_) => 7,
            Control::Skip(_) => 8,
            Control::FileEnd { .. } => 9,
            Control::FileDone(_) => 10,
            Control::FileError { .. } => 11,
            Control::ChunkBad { .. } => 12,
            Control::Summary(_) => 13,
            Control::Fatal { .. } => 14,
            Control::Plan { .. } => 15,
            Control::Bye => 16,
            Control::StreamCount(_) => 17,
            Control::Hook { .. } => 18,
            Control::HookDone { .. } => 19,
            Control::Dial { .. } => 20,
            Control::Listening { .. } => 21,
            Control::Filters(_) => 22,
            Control::FileList(_) => 23,
            Control::StreamReset { .. } => 24,
            Control::Resending { .. } => 25,
            Control::RecordBad { .. } => 26,
            Control::FsRequest { .. } => 27,
            Control::FsEntries(_) => 28,
            Control::FsEnd { .. } => 29,
            Control::TestRequest { .. } => 30,
            Control::TestStep { .. } => 31,
            Control::TestResult { .. } => 32,
            Control::ClusterRequest => 33,
            Control::ClusterNodes { .. } => 34,
            Control::Stripe { .. } => 35,
        }
    }

    /// The whole frame, header included.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Control::Hello { min_version, max_version, features } => {
                w.raw(MAGIC).u16(*min_version).u16(*max_version).u64(*features);
            }
            Control::Auth { nonce, proof } => {
                w.raw(nonce).raw(proof);
            }
            Control::Open { server_role, options, sources, destination } => {
                w.u8(match server_role {
                    Role::Sender => 0,
                    Role::Receiver => 1,
                });
                w.u32(options.flags).u32(options.chunk_size).u16(options.streams).u32(options.concurrency);
                w.u32(sources.len() as u32);
                for s in sources {
                    w.bytes(s);
                }
                w.bytes(destination);
            }
            Control::Ready { session_id, data_addr, nonce, cert_pin } => {
                w.raw(session_id).bytes(data_addr).raw(nonce);
                if let Some(pin) = cert_pin {
                    w.raw(pin);
                }
            }
            Control::Entries(entries) => {
                w.u32(entries.len() as u32);
                for e in entries {
                    w.u64(e.id).u8(match e.kind {
                        EntryKind::File if e.stripe.is_some() => 4,
                        EntryKind::File => 0,
                        EntryKind::Dir => 1,
                        EntryKind::Symlink => 2,
                        EntryKind::HardLink => 3,
                    });
                    w.bytes(&e.path).u64(e.size).u32(e.mode).i64(e.mtime_s).u32(e.mtime_ns);
                    w.bytes(&e.target);
                    match &e.hash {
                        Some(h) => w.u8(1).raw(h),
                        None => w.u8(0),
                    };
                    if let (EntryKind::File, Some((start, end))) = (e.kind, e.stripe) {
                        w.u64(start).u64(end);
                    }
                }
            }
            Control::ManifestEnd { files, bytes } => {
                w.u64(*files).u64(*bytes);
            }
            Control::Want(files) => {
                w.u32(files.len() as u32);
                for f in files {
                    w.u64(f.id).u32(f.ranges.len() as u32);
                    for (start, count) in &f.ranges {
                        w.u64(*start).u32(*count);
                    }
                }
            }
            Control::Skip(items) => {
                w.u32(items.len() as u32);
                for (id, reason) in items {
                    w.u64(*id).u8(match reason {
                        SkipReason::Identical => 0,
                        SkipReason::DryRun => 1,
                    });
                }
            }
            Control::FileEnd { id, file_hash, size, mtime_s, mtime_ns } => {
                w.u64(*id).raw(file_hash).u64(*size).i64(*mtime_s).u32(*mtime_ns);
            }
            Control::FileDone(ids) => {
                w.u32(ids.len() as u32);
                for id in ids {
                    w.u64(*id);
                }
            }
            Control::FileError { id, side, message } => {
                w.u64(*id).u8(side.to_u8()).bytes(truncate(message.as_bytes(), limits::MAX_MESSAGE));
            }
            Control::ChunkBad { id, chunk } => {
                w.u64(*id).u64(*chunk);
            }
            Control::StreamReset { index, received } => {
                w.u32(*index).u64(*received);
            }
            Control::Resending { index, chunks, bytes } => {
                w.u32(*index).u64(*chunks).u64(*bytes);
            }
            Control::RecordBad { index, seq } => {
                w.u32(*index).u64(*seq);
            }
            Control::Summary(s) => {
                w.u64(s.files_done).u64(s.files_failed).u64(s.bytes_written);
                w.u64(s.chunks_resent).u64(s.bytes_resent).u64(s.deleted);
            }
            Control::Fatal { side, message } => {
                w.u8(side.to_u8()).bytes(truncate(message.as_bytes(), limits::MAX_MESSAGE));
            }
            Control::Plan { action, path } => {
                w.u8(match action {
                    PlanAction::Copy => 0,
                    PlanAction::Skip => 1,
                    PlanAction::Delete => 2,
                });
                w.bytes(path);
            }
            Control::Bye => {}
            Control::StreamCount(n) => {
                w.u16(*n);
            }
            Control::Hook { name, path } => {
                w.bytes(truncate(name.as_bytes(), limits::MAX_HOOK_NAME)).bytes(path);
            }
            Control::HookDone { status, output } => {
                w.u32(*status as u32).bytes(truncate(output.as_bytes(), limits::MAX_MESSAGE));
            }
            Control::Dial { addr, session_id, ticket } => {
                w.bytes(addr).raw(session_id).raw(ticket);
            }
            Control::Filters(rules) => {
                w.u32(rules.len() as u32);
                for r in rules {
                    w.u8(u8::from(r.kind == RuleKind::Include)).bytes(r.pattern.as_bytes());
                }
            }
            Control::Listening { data_addr } => {
                w.bytes(data_addr);
            }
            Control::FileList(paths) => {
                w.u32(paths.len() as u32);
                for p in paths {
                    w.bytes(p);
                }
            }
            Control::Stripe { path, start, end } => {
                w.bytes(path).u64(*start).u64(*end);
            }
            Control::FsRequest { op, flags, path } => {
                w.u8(op.to_u8()).u8(*flags).bytes(path);
            }
            Control::FsEntries(entries) => {
                w.u32(entries.len() as u32);
                for e in entries {
                    w.u8(match e.kind {
                        FsKind::File => 0,
                        FsKind::Dir => 1,
                        FsKind::Symlink => 2,
                        FsKind::Other => 3,
                    });
                    w.bytes(&e.name).u64(e.size).u32(e.mode).i64(e.mtime_s).u32(e.mtime_ns).bytes(&e.target);
                }
            }
            Control::FsEnd { count } => {
                w.u64(*count);
            }
            Control::TestRequest { path, flags, streams, chunk_size } => {
                w.bytes(path).u8(*flags).u16(*streams).u32(*chunk_size);
            }
            Control::TestStep { what, count, millis } => {
                w.u8(what.to_u8()).u16(*count).u32(*millis);
            }
            Control::TestResult { what, skipped, bytes, micros, note } => {
                w.u8(what.to_u8()).u8(*skipped as u8).u64(*bytes).u64(*micros).bytes(note.as_bytes());
            }
            Control::ClusterRequest => {}
            Control::ClusterNodes { cluster, nodes } => {
                w.bytes(cluster.as_bytes()).u32(nodes.len() as u32);
                for n in nodes {
                    w.bytes(n);
                }
            }
        }
        encode_frame(self.type_byte(), &w.buf)
    }

    /// Decodes one control frame body. Refuses anything out of bounds or left over.
    pub fn decode(frame_type: u8, body: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(body);
        let msg = match frame_type {
            1 => {
                if &r.array::<4>("magic")? != MAGIC {
                    return Err(ProtoError::BadMagic);
                }
                Control::Hello { min_version: r.u16("min_version")?, max_version: r.u16("max_version")?, features: r.u64("features")? }
            }
            2 => Control::Auth { nonce: r.array("nonce")?, proof: r.array("proof")? },
            3 => {
                let server_role = match r.u8("role")? {
                    0 => Role::Sender,
                    1 => Role::Receiver,
                    _ => return Err(ProtoError::Invalid { what: "role", why: "unknown value" }),
                };
                let options = Options { flags: r.u32("flags")?, chunk_size: r.u32("chunk_size")?, streams: r.u16("streams")?, concurrency: r.u32("concurrency")? };
                if options.chunk_size < limits::MIN_CHUNK_SIZE || options.chunk_size > limits::MAX_CHUNK_SIZE {
                    return Err(ProtoError::Invalid { what: "chunk size", why: "out of range" });
                }
                if options.streams == 0 || options.streams > limits::MAX_STREAMS {
                    return Err(ProtoError::Invalid { what: "stream count", why: "out of range" });
                }
                let n = r.count("sources")?;
                let mut sources = Vec::with_capacity(n);
                for _ in 0..n {
                    sources.push(r.bytes("source path", limits::MAX_PATH)?.to_vec());
                }
                let destination = r.bytes("destination path", limits::MAX_PATH)?.to_vec();
                Control::Open { server_role, options, sources, destination }
            }
            4 => Control::Ready {
                session_id: r.array("session_id")?,
                data_addr: r.bytes("data address", MAX_ADDR)?.to_vec(),
                nonce: r.array("nonce")?,
                cert_pin: if r.remaining().is_empty() { None } else { Some(r.array("certificate pin")?) },
            },
            5 => {
                let n = r.count("entries")?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let id = r.u64("id")?;
                    let kind_byte = r.u8("kind")?;
                    let kind = match kind_byte {
                        0 | 4 => EntryKind::File,
                        1 => EntryKind::Dir,
                        2 => EntryKind::Symlink,
                        3 => EntryKind::HardLink,
                        _ => return Err(ProtoError::Invalid { what: "entry kind", why: "unknown value" }),
                    };
                    let path = r.bytes("path", limits::MAX_PATH)?.to_vec();
                    validate_relative(&path)?;
                    let size = r.u64("size")?;
                    let mode = r.u32("mode")?;
                    let mtime_s = r.i64("mtime")?;
                    let mtime_ns = r.u32("mtime_ns")?;
                    if mtime_ns >= 1_000_000_000 {
                        return Err(ProtoError::Invalid { what: "mtime", why: "nanoseconds out of range" });
                    }
                    let target = r.bytes("symlink target", limits::MAX_PATH)?.to_vec();
                    match kind {
                        EntryKind::Symlink => {}
                        // The first name of the same file: a path in the tree like any other.
                        EntryKind::HardLink if target.is_empty() => return Err(ProtoError::Invalid { what: "hard link", why: "no target" }),
                        EntryKind::HardLink => validate_relative(&target)?,
                        _ if !target.is_empty() => return Err(ProtoError::Invalid { what: "entry", why: "target on a non-link" }),
                        _ => {}
                    }
                    let hash = match r.u8("hash flag")? {
                        0 => None,
                        1 => Some(r.array("hash")?),
                        _ => return Err(ProtoError::Invalid { what: "hash flag", why: "unknown value" }),
                    };
                    let stripe = if kind_byte == 4 {
                        let (start, end) = (r.u64("stripe start")?, r.u64("stripe end")?);
                        if start >= end || end > size {
                            return Err(ProtoError::Invalid { what: "stripe", why: "empty, or past the end of the file" });
                        }
                        Some((start, end))
                    } else {
                        None
                    };
                    entries.push(Entry { id, kind, path, size, mode, mtime_s, mtime_ns, target, hash, stripe });
                }
                Control::Entries(entries)
            }
            6 => Control::ManifestEnd { files: r.u64("files")?, bytes: r.u64("bytes")? },
            7 => {
                let n = r.count("want files")?;
                let mut files = Vec::with_capacity(n);
                for _ in 0..n {
                    let id = r.u64("id")?;
                    let m = r.count("want ranges")?;
                    let mut ranges = Vec::with_capacity(m);
                    for _ in 0..m {
                        ranges.push((r.u64("range start")?, r.u32("range count")?));
                    }
                    files.push(WantFile { id, ranges });
                }
                Control::Want(files)
            }
            8 => {
                let n = r.count("skips")?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    let id = r.u64("id")?;
                    let reason = match r.u8("reason")? {
                        0 => SkipReason::Identical,
                        1 => SkipReason::DryRun,
                        _ => return Err(ProtoError::Invalid { what: "skip reason", why: "unknown value" }),
                    };
                    items.push((id, reason));
                }
                Control::Skip(items)
            }
            9 => Control::FileEnd { id: r.u64("id")?, file_hash: r.array("file hash")?, size: r.u64("size")?, mtime_s: r.i64("mtime")?, mtime_ns: r.u32("mtime_ns")? },
            10 => {
                let n = r.count("done ids")?;
                let mut ids = Vec::with_capacity(n);
                for _ in 0..n {
                    ids.push(r.u64("id")?);
                }
                Control::FileDone(ids)
            }
            11 => Control::FileError { id: r.u64("id")?, side: Side::from_u8(r.u8("side")?)?, message: r.message()? },
            12 => Control::ChunkBad { id: r.u64("id")?, chunk: r.u64("chunk")? },
            24 => Control::StreamReset { index: r.u32("stream index")?, received: r.u64("frames received")? },
            25 => Control::Resending { index: r.u32("stream index")?, chunks: r.u64("chunks")?, bytes: r.u64("bytes")? },
            26 => Control::RecordBad { index: r.u32("stream index")?, seq: r.u64("frame sequence")? },
            13 => Control::Summary(Summary {
                files_done: r.u64("files_done")?,
                files_failed: r.u64("files_failed")?,
                bytes_written: r.u64("bytes_written")?,
                chunks_resent: r.u64("chunks_resent")?,
                bytes_resent: r.u64("bytes_resent")?,
                deleted: r.u64("deleted")?,
            }),
            14 => Control::Fatal { side: Side::from_u8(r.u8("side")?)?, message: r.message()? },
            15 => {
                let action = match r.u8("action")? {
                    0 => PlanAction::Copy,
                    1 => PlanAction::Skip,
                    2 => PlanAction::Delete,
                    _ => return Err(ProtoError::Invalid { what: "plan action", why: "unknown value" }),
                };
                Control::Plan { action, path: r.bytes("path", limits::MAX_PATH)?.to_vec() }
            }
            16 => Control::Bye,
            17 => Control::StreamCount(r.u16("streams")?),
            18 => {
                let name = r.bytes("hook name", limits::MAX_HOOK_NAME)?;
                let name = std::str::from_utf8(name).map_err(|_| ProtoError::Invalid { what: "hook name", why: "not UTF-8" })?.to_string();
                Control::Hook { name, path: r.bytes("hook path", limits::MAX_PATH)?.to_vec() }
            }
            19 => Control::HookDone { status: r.u32("hook status")? as i32, output: r.message()? },
            20 => Control::Dial { addr: r.bytes("dial address", MAX_ADDR)?.to_vec(), session_id: r.array("session_id")?, ticket: r.array("ticket")? },
            21 => Control::Listening { data_addr: r.bytes("data address", MAX_ADDR)?.to_vec() },
            22 => {
                let n = r.u32("filter rules")? as usize;
                if n > MAX_FILTER_RULES {
                    return Err(ProtoError::TooLong { what: "filter rules", len: n, max: MAX_FILTER_RULES });
                }
                let mut rules = Vec::with_capacity(n);
                for _ in 0..n {
                    let kind = match r.u8("rule kind")? {
                        0 => RuleKind::Exclude,
                        1 => RuleKind::Include,
                        _ => return Err(ProtoError::Invalid { what: "rule kind", why: "unknown value" }),
                    };
                    let pattern = r.bytes("filter pattern", MAX_PATTERN)?;
                    let pattern = std::str::from_utf8(pattern).map_err(|_| ProtoError::Invalid { what: "filter pattern", why: "not UTF-8" })?.to_string();
                    rules.push(FilterRule { kind, pattern });
                }
                Control::Filters(rules)
            }
            23 => {
                let n = r.count("file list")?;
                let mut paths = Vec::with_capacity(n);
                for _ in 0..n {
                    let p = r.bytes("listed path", limits::MAX_PATH)?;
                    validate_relative(p)?;
                    paths.push(p.to_vec());
                }
                Control::FileList(paths)
            }
            35 => {
                let path = r.bytes("stripe path", limits::MAX_PATH)?.to_vec();
                validate_relative(&path)?;
                let (start, end) = (r.u64("stripe start")?, r.u64("stripe end")?);
                if start >= end {
                    return Err(ProtoError::Invalid { what: "stripe", why: "empty" });
                }
                Control::Stripe { path, start, end }
            }
            27 => {
                let op = FsOp::from_u8(r.u8("file-system op")?)?;
                let flags = r.u8("file-system flags")?;
                if flags & !(FS_RECURSIVE | FS_PARENTS | FS_FORCE) != 0 {
                    return Err(ProtoError::Invalid { what: "file-system flags", why: "unknown bit" });
                }
                Control::FsRequest { op, flags, path: r.bytes("file-system path", limits::MAX_PATH)?.to_vec() }
            }
            28 => {
                let n = r.count("file-system entries")?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let kind = match r.u8("entry kind")? {
                        0 => FsKind::File,
                        1 => FsKind::Dir,
                        2 => FsKind::Symlink,
                        3 => FsKind::Other,
                        _ => return Err(ProtoError::Invalid { what: "entry kind", why: "unknown value" }),
                    };
                    let name = r.bytes("entry name", limits::MAX_PATH)?.to_vec();
                    let (size, mode, mtime_s, mtime_ns) = (r.u64("size")?, r.u32("mode")?, r.i64("mtime")?, r.u32("mtime_ns")?);
                    if mtime_ns >= 1_000_000_000 {
                        return Err(ProtoError::Invalid { what: "mtime", why: "nanoseconds out of range" });
                    }
                    let target = r.bytes("symlink target", limits::MAX_PATH)?.to_vec();
                    if kind != FsKind::Symlink && !target.is_empty() {
                        return Err(ProtoError::Invalid { what: "entry", why: "target on a non-symlink" });
                    }
                    entries.push(FsEntry { kind, name, size, mode, mtime_s, mtime_ns, target });
                }
                Control::FsEntries(entries)
            }
            29 => Control::FsEnd { count: r.u64("entry count")? },
            30 => {
                let path = r.bytes("test path", limits::MAX_PATH)?.to_vec();
                let flags = r.u8("test flags")?;
                if flags & !(TEST_NO_ENCRYPT | TEST_PULL) != 0 {
                    return Err(ProtoError::Invalid { what: "test flags", why: "unknown bit" });
                }
                let streams = r.u16("test streams")?;
                if streams == 0 || streams > MAX_TEST_STREAMS {
                    return Err(ProtoError::Invalid { what: "test streams", why: "not 1..=64" });
                }
                let chunk_size = r.u32("test chunk size")?;
                if !(limits::MIN_CHUNK_SIZE..=limits::MAX_CHUNK_SIZE).contains(&chunk_size) {
                    return Err(ProtoError::Invalid { what: "test chunk size", why: "out of range" });
                }
                Control::TestRequest { path, flags, streams, chunk_size }
            }
            31 => {
                let what = TestWhat::from_u8(r.u8("test step")?)?;
                let count = r.u16("test count")?;
                if count == 0 || count > MAX_TEST_STREAMS {
                    return Err(ProtoError::Invalid { what: "test count", why: "not 1..=64" });
                }
                let millis = r.u32("test duration")?;
                if !(MIN_TEST_STEP_MS..=MAX_TEST_STEP_MS).contains(&millis) {
                    return Err(ProtoError::Invalid { what: "test duration", why: "not 100..=20000 ms" });
                }
                Control::TestStep { what, count, millis }
            }
            32 => {
                let what = TestWhat::from_u8(r.u8("test step")?)?;
                let skipped = match r.u8("test status")? {
                    0 => false,
                    1 => true,
                    _ => return Err(ProtoError::Invalid { what: "test status", why: "unknown value" }),
                };
                let (bytes, micros) = (r.u64("test bytes")?, r.u64("test time")?);
                let note = r.bytes("test note", limits::MAX_MESSAGE)?;
                let note = std::str::from_utf8(note).map_err(|_| ProtoError::Invalid { what: "test note", why: "not UTF-8" })?.to_string();
                Control::TestResult { what, skipped, bytes, micros, note }
            }
            33 => Control::ClusterRequest,
            34 => {
                let cluster = r.bytes("cluster name", MAX_CLUSTER_NAME)?;
                let cluster = std::str::from_utf8(cluster).map_err(|_| ProtoError::Invalid { what: "cluster name", why: "not UTF-8" })?.to_string();
                let n = r.u32("cluster nodes")? as usize;
                if n > MAX_CLUSTER_NODES {
                    return Err(ProtoError::Invalid { what: "cluster nodes", why: "more than 256" });
                }
                let mut nodes = Vec::with_capacity(n);
                for _ in 0..n {
                    nodes.push(r.bytes("node address", MAX_ADDR)?.to_vec());
                }
                Control::ClusterNodes { cluster, nodes }
            }
            other => return Err(ProtoError::UnknownType(other)),
        };
        r.finish()?;
        Ok(msg)
    }
}

fn truncate(b: &[u8], max: usize) -> &[u8] {
    &b[..b.len().min(max)]
}

/// Picks the highest version both peers speak.
pub fn negotiate_version(ours: (u16, u16), theirs: (u16, u16)) -> Result<u16, ProtoError> {
    let high = ours.1.min(theirs.1);
    let low = ours.0.max(theirs.0);
    if high < low {
        return Err(ProtoError::VersionMismatch { ours_min: ours.0, ours_max: ours.1, theirs_min: theirs.0, theirs_max: theirs.1 });
    }
    Ok(high)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameDecoder;

    fn roundtrip(m: Control) {
        let bytes = m.encode();
        let mut d = FrameDecoder::new(limits::MAX_CONTROL_FRAME);
        d.push(&bytes);
        let (t, body) = d.next_frame().unwrap().unwrap();
        assert_eq!(Control::decode(t, &body).unwrap(), m);
    }

    #[test]
    fn every_message_roundtrips() {
        let mut opts = Options { flags: 0, chunk_size: 4 << 20, streams: 8, concurrency: 100 };
        opts.set_preserve(true);
        opts.set_delete(true);
        roundtrip(Control::Hello { min_version: 1, max_version: 3, features: 5 });
        roundtrip(Control::Auth { nonce: [1; 32], proof: [2; 32] });
        roundtrip(Control::Open { server_role: Role::Receiver, options: opts, sources: vec![b"a".to_vec(), b"\xffb".to_vec()], destination: b"/dst".to_vec() });
        roundtrip(Control::Ready { session_id: [3; 16], data_addr: b"[::1]:99".to_vec(), nonce: [4; 32], cert_pin: None });
        roundtrip(Control::Ready { session_id: [3; 16], data_addr: b"[::1]:99".to_vec(), nonce: [4; 32], cert_pin: Some([5; 32]) });
        roundtrip(Control::Entries(vec![Entry {
            id: 9,
            kind: EntryKind::Symlink,
            path: b"d/l".to_vec(),
            size: 0,
            mode: 0o777,
            mtime_s: -5,
            mtime_ns: 7,
            target: b"x".to_vec(),
            hash: Some([8; 32]),
            stripe: None,
        }]));
        roundtrip(Control::Entries(vec![Entry {
            id: 10,
            kind: EntryKind::HardLink,
            path: b"d/second".to_vec(),
            size: 5,
            mode: 0o644,
            mtime_s: 1,
            mtime_ns: 0,
            target: b"a/first".to_vec(),
            hash: None,
            stripe: None,
        }]));
        // A stripe of a file: kind 4 on the wire, its range after the hash flag.
        let stripe = Entry { id: 12, kind: EntryKind::File, path: b"big".to_vec(), size: 10 << 20, mode: 0o644, mtime_s: 1, mtime_ns: 0, target: vec![], hash: None, stripe: Some((4 << 20, 8 << 20)) };
        roundtrip(Control::Entries(vec![stripe.clone()]));
        roundtrip(Control::Stripe { path: b"d/big".to_vec(), start: 0, end: 4 << 20 });
        for bad in [(8 << 20, 8 << 20), (4 << 20, 11 << 20)] {
            let bytes = Control::Entries(vec![Entry { stripe: Some(bad), ..stripe.clone() }]).encode();
            let mut d = FrameDecoder::new(limits::MAX_CONTROL_FRAME);
            d.push(&bytes);
            let (t, body) = d.next_frame().unwrap().unwrap();
            assert!(Control::decode(t, &body).is_err(), "stripe {bad:?} of a 10 MiB file accepted");
        }
        // A hard link's target is a path in the tree: never absolute, never climbing out.
        for bad in [&b"../outside"[..], b"/etc/passwd", b"a/../../x", b""] {
            let msg =
                Control::Entries(vec![Entry { id: 11, kind: EntryKind::HardLink, path: b"l".to_vec(), size: 0, mode: 0o644, mtime_s: 0, mtime_ns: 0, target: bad.to_vec(), hash: None, stripe: None }]);
            let mut d = FrameDecoder::new(limits::MAX_CONTROL_FRAME);
            d.push(&msg.encode());
            let (t, body) = d.next_frame().unwrap().unwrap();
            assert!(Control::decode(t, &body).is_err(), "hard link to {:?} accepted", String::from_utf8_lossy(bad));
        }
        roundtrip(Control::ManifestEnd { files: 1, bytes: 2 });
        roundtrip(Control::Want(vec![WantFile { id: 1, ranges: vec![(0, 3), (7, 1)] }]));
        roundtrip(Control::Skip(vec![(1, SkipReason::Identical), (2, SkipReason::DryRun)]));
        roundtrip(Control::FileEnd { id: 1, file_hash: [5; 32], size: 10, mtime_s: 11, mtime_ns: 12 });
        roundtrip(Control::FileDone(vec![1, 2, 3]));
        roundtrip(Control::FileError { id: 4, side: Side::Destination, message: "no space".into() });
        roundtrip(Control::ChunkBad { id: 4, chunk: 2 });
        roundtrip(Control::StreamReset { index: 65537, received: 12 });
        roundtrip(Control::Resending { index: 3, chunks: 5, bytes: 5 << 22 });
        roundtrip(Control::RecordBad { index: 65536, seq: 1 << 40 });
        roundtrip(Control::Summary(Summary { files_done: 1, deleted: 2, ..Default::default() }));
        roundtrip(Control::Fatal { side: Side::Network, message: "x".into() });
        roundtrip(Control::Plan { action: PlanAction::Delete, path: b"old".to_vec() });
        roundtrip(Control::Bye);
        roundtrip(Control::StreamCount(12));
        roundtrip(Control::Hook { name: "analyze".into(), path: b"/incoming/snap_003".to_vec() });
        roundtrip(Control::HookDone { status: -1, output: "killed".into() });
        roundtrip(Control::Dial { addr: b"[2001:db8::7]:7700".to_vec(), session_id: [6; 16], ticket: [7; 32] });
        roundtrip(Control::Filters(vec![FilterRule::include("*/"), FilterRule::exclude("/run*/**/*.tmp")]));
        roundtrip(Control::FileList(vec![b"run1/a.h5".to_vec(), b"d/\xff name".to_vec()]));
        roundtrip(Control::Listening { data_addr: b"192.0.2.7:50001".to_vec() });
        roundtrip(Control::Listening { data_addr: b":50001".to_vec() });
        roundtrip(Control::ClusterRequest);
        roundtrip(Control::ClusterNodes { cluster: "site-b".into(), nodes: vec![b"198.18.20.1:7700".to_vec(), b"dtn02.example.org:7700".to_vec()] });
        let mut tp = opts;
        tp.set_third_party(true);
        assert!(tp.third_party() && !opts.third_party());
        roundtrip(Control::Open { server_role: Role::Sender, options: tp, sources: vec![b"/x".to_vec()], destination: vec![] });
        roundtrip(Control::FsRequest { op: FsOp::Remove, flags: FS_RECURSIVE | FS_FORCE, path: b"/data/\xffold".to_vec() });
        roundtrip(Control::FsRequest { op: FsOp::Glob, flags: 0, path: b"run_??/*.h5".to_vec() });
        let link = FsEntry { kind: FsKind::Symlink, name: b"sub/l".to_vec(), size: 3, mode: 0o120777, mtime_s: -1, mtime_ns: 999_999_999, target: b"../x".to_vec() };
        let file = FsEntry { kind: FsKind::File, name: b"a.h5".to_vec(), size: 1 << 40, mode: 0o100644, mtime_s: 1_700_000_000, mtime_ns: 0, target: vec![] };
        roundtrip(Control::FsEntries(vec![link, file]));
        roundtrip(Control::FsEntries(vec![]));
        roundtrip(Control::FsEnd { count: 2 });
        roundtrip(Control::TestRequest { path: b"/data/run".to_vec(), flags: TEST_PULL, streams: 8, chunk_size: 1 << 20 });
        roundtrip(Control::TestStep { what: TestWhat::Write, count: 8, millis: 3000 });
        roundtrip(Control::TestResult { what: TestWhat::Write, skipped: true, bytes: 0, micros: 0, note: "not writable".into() });
        roundtrip(Control::TestStep { what: TestWhat::Cpu, count: 1, millis: 100 });
        roundtrip(Control::TestResult { what: TestWhat::Cpu, skipped: false, bytes: 500, micros: 1_234_567, note: "CPU quota 0.50 cores".into() });
        for (bad, why) in [
            (Control::TestRequest { path: vec![], flags: 0, streams: 65, chunk_size: 1 << 20 }, "too many streams"),
            (Control::TestRequest { path: vec![], flags: 0, streams: 0, chunk_size: 1 << 20 }, "no stream"),
            (Control::TestRequest { path: vec![], flags: 4, streams: 1, chunk_size: 1 << 20 }, "unknown flag"),
            (Control::TestRequest { path: vec![], flags: 0, streams: 1, chunk_size: 1 << 30 }, "huge chunks"),
            (Control::TestStep { what: TestWhat::Carry, count: 1, millis: 20_001 }, "too long a step"),
            (Control::TestStep { what: TestWhat::Carry, count: 0, millis: 1000 }, "no stream"),
        ] {
            let f = bad.encode();
            assert!(Control::decode(f[4], &f[5..]).is_err(), "{why}");
        }
    }

    #[test]
    fn refuses_cluster_answers_out_of_bounds() {
        let mut w = Writer::new();
        w.bytes(b"site").u32(MAX_CLUSTER_NODES as u32 + 1);
        assert!(Control::decode(34, &w.buf).is_err(), "more nodes than the bound");
        let mut w = Writer::new();
        w.bytes(b"site").u32(1).bytes(&[b'a'; MAX_ADDR + 1]);
        assert!(Control::decode(34, &w.buf).is_err(), "an oversized address");
        let mut w = Writer::new();
        w.bytes(&[b'c'; MAX_CLUSTER_NAME + 1]).u32(0);
        assert!(Control::decode(34, &w.buf).is_err(), "an oversized name");
        let mut w = Writer::new();
        w.bytes(b"site").u32(2).bytes(b"a:1");
        assert!(Control::decode(34, &w.buf).is_err(), "fewer nodes than announced");
        assert!(Control::decode(33, &[0]).is_err(), "a request carries nothing");
    }

    #[test]
    fn refuses_bad_fs_requests_and_entries() {
        let mut w = Writer::new();
        w.u8(9).u8(0).bytes(b"/x");
        assert!(Control::decode(27, &w.buf).is_err(), "unknown op");
        let mut w = Writer::new();
        w.u8(0).u8(8).bytes(b"/x");
        assert!(Control::decode(27, &w.buf).is_err(), "unknown flag bit");
        let mut w = Writer::new();
        w.u8(4).u8(0).bytes(&[b'*'; limits::MAX_PATH + 1]);
        assert!(matches!(Control::decode(27, &w.buf), Err(ProtoError::TooLong { .. })), "an oversized pattern");
        let mut w = Writer::new();
        w.u32(limits::MAX_LIST as u32 + 1);
        assert!(matches!(Control::decode(28, &w.buf), Err(ProtoError::TooLong { .. })));
        let mut w = Writer::new();
        w.u32(1).u8(0).bytes(b"f").u64(0).u32(0).i64(0).u32(0).bytes(b"target");
        assert!(Control::decode(28, &w.buf).is_err(), "a target on a file");
        let mut w = Writer::new();
        w.u32(1).u8(1).bytes(b"d").u64(0).u32(0).i64(0).u32(1_000_000_000).bytes(b"");
        assert!(Control::decode(28, &w.buf).is_err(), "nanoseconds out of range");
        let mut w = Writer::new();
        w.u32(1).u8(7).bytes(b"d").u64(0).u32(0).i64(0).u32(0).bytes(b"");
        assert!(Control::decode(28, &w.buf).is_err(), "unknown kind");
        let mut bytes = Control::FsEnd { count: 1 }.encode();
        bytes.push(0);
        assert_eq!(Control::decode(29, &bytes[5..]), Err(ProtoError::TrailingBytes(1)));
    }

    #[test]
    fn refuses_long_dial_address() {
        let mut w = Writer::new();
        w.bytes(&[b'a'; MAX_ADDR + 1]).raw(&[0; 16]).raw(&[0; 32]);
        assert!(matches!(Control::decode(20, &w.buf), Err(ProtoError::TooLong { .. })));
        let mut w = Writer::new();
        w.bytes(b"h:1").raw(&[0; 16]).raw(&[0; 31]);
        assert!(Control::decode(20, &w.buf).is_err(), "a short ticket is refused");
    }

    #[test]
    fn refuses_long_or_padded_listening_address() {
        let mut w = Writer::new();
        w.bytes(&[b'a'; MAX_ADDR + 1]);
        assert!(matches!(Control::decode(21, &w.buf), Err(ProtoError::TooLong { .. })));
        let mut w = Writer::new();
        w.bytes(&[b'a'; MAX_ADDR]);
        assert!(Control::decode(21, &w.buf).is_ok(), "the bound itself is allowed");
        w.u8(0);
        assert_eq!(Control::decode(21, &w.buf), Err(ProtoError::TrailingBytes(1)));
        assert!(Control::decode(21, &[0, 0]).is_err(), "a short length is refused");
        let mut w = Writer::new();
        w.u32(u32::MAX);
        assert!(matches!(Control::decode(21, &w.buf), Err(ProtoError::TooLong { .. })), "a huge length is refused before allocation");
    }

    #[test]
    fn feature_bits_are_distinct() {
        assert_eq!(FEATURE_THIRD_PARTY & FEATURE_EARLY_DATA_ADDR, 0);
        assert_eq!(FEATURE_EARLY_DATA_ADDR, 1 << 1);
        let all = [
            FEATURE_THIRD_PARTY,
            FEATURE_EARLY_DATA_ADDR,
            FEATURE_FILTERS,
            FEATURE_FILE_LIST,
            FEATURE_IGNORE_EXISTING,
            FEATURE_STREAM_RESET,
            FEATURE_HARD_LINKS,
            FEATURE_FS_OPS,
            FEATURE_PATH_TESTS,
            FEATURE_TEST_CPU,
            FEATURE_HOST_FACTS,
        ];
        assert_eq!(all.iter().fold(0, |a, b| a | b).count_ones() as usize, all.len());
    }

    #[test]
    fn refuses_escaping_entry_path() {
        let m = Control::Entries(vec![Entry { id: 0, kind: EntryKind::File, path: b"../../etc/passwd".to_vec(), size: 0, mode: 0, mtime_s: 0, mtime_ns: 0, target: vec![], hash: None, stripe: None }]);
        let bytes = m.encode();
        assert!(matches!(Control::decode(bytes[4], &bytes[5..]), Err(ProtoError::Invalid { .. })));
    }

    #[test]
    fn refuses_trailing_bytes_and_huge_lists() {
        let mut bytes = Control::Bye.encode();
        bytes.push(0);
        assert_eq!(Control::decode(16, &bytes[5..]), Err(ProtoError::TrailingBytes(1)));
        let mut w = Writer::new();
        w.u32(u32::MAX);
        assert!(matches!(Control::decode(10, &w.buf), Err(ProtoError::TooLong { .. })));
    }

    #[test]
    fn refuses_too_many_or_too_long_filter_rules() {
        let mut w = Writer::new();
        w.u32(MAX_FILTER_RULES as u32 + 1);
        assert!(matches!(Control::decode(22, &w.buf), Err(ProtoError::TooLong { .. })));
        let mut w = Writer::new();
        w.u32(1).u8(0).bytes(&[b'a'; MAX_PATTERN + 1]);
        assert!(matches!(Control::decode(22, &w.buf), Err(ProtoError::TooLong { .. })));
        let mut w = Writer::new();
        w.u32(1).u8(7).bytes(b"*");
        assert!(Control::decode(22, &w.buf).is_err());
    }

    #[test]
    fn refuses_escaping_or_oversized_file_lists() {
        let mut w = Writer::new();
        w.u32(1).bytes(b"../etc/passwd");
        assert!(Control::decode(23, &w.buf).is_err());
        let mut w = Writer::new();
        w.u32(1).bytes(b"/etc/passwd");
        assert!(Control::decode(23, &w.buf).is_err());
        let mut w = Writer::new();
        w.u32(limits::MAX_LIST as u32 + 1);
        assert!(matches!(Control::decode(23, &w.buf), Err(ProtoError::TooLong { .. })));
    }

    #[test]
    fn refuses_long_hook_names() {
        let mut w = Writer::new();
        w.bytes(&[b'a'; 65]).bytes(b"/p");
        assert!(matches!(Control::decode(18, &w.buf), Err(ProtoError::TooLong { .. })));
    }

    #[test]
    fn versions_negotiate() {
        assert_eq!(negotiate_version((1, 2), (2, 5)), Ok(2));
        assert!(negotiate_version((1, 1), (2, 3)).is_err());
    }
}
