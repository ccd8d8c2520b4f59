//! The binary codec of the peer protocol: what cluster nodes send each other
//! on their peer connections, as bytes. Pure functions, no I/O: the
//! replication core appends encoded frames to its send buffers and calls
//! [`decode`] on what it has received.
//!
//! # Layout
//!
//! Every frame is a `u32` length, then that many bytes: a one-byte frame type
//! and the type's payload. All integers are little-endian and fixed-width;
//! there is no padding and no optional field, so every frame has exactly one
//! encoding and the payload must be consumed exactly.
//!
//! ```text
//! frame      = len:u32  type:u8  payload          len = 1 + payload bytes, at most FRAME_LEN_MAX
//! table      = stream:u64  version:u64            a TableVersion
//! index      = u8                                 0..NODES_MAX, or 0xFF for "none" where optional
//! role       = u8                                 1 active, 2 standby, 3 leaving
//! flag       = u8                                 0 or 1
//! key        = len:u8  bytes                      1..=250 bytes, none of space, tab, CR, LF, NUL
//! name       = len:u8  bytes                      0..=250 bytes: the name that took a grant, 0 for none
//! nonce      = 32 bytes                           fresh from the system's random source, never reused
//! mac        = 32 bytes                           HMAC-SHA256 with the peer secret (see below)
//!
//! type  frame                 payload
//!  1    Hello                 magic "RLKP"  version:u32  nodes:u8  node:u8  incarnation:u64  epoch:u64  role
//!                             peers_fingerprint:u64
//!  2    Heartbeat             incarnation:u64  sequence:u64  role  epoch:u64  epoch_seen:u64
//!                             following:index  caught_up:flag  has_table:flag  table  handing_off_to:index
//!  3    SnapshotRequest       (empty)
//!  4    HandOff               table  epoch_seen:u64
//!  5    HandOffDone           table  epoch:u64
//!  6    HandOffRefused        table
//!  7    SnapshotBegin         table
//!  8    SnapshotChunk         count:u32  count × (key  token:u64  lease_left_ms:u64  name)
//!  9    SnapshotEnd           table
//! 10    Deltas                stream:u64  first_version:u64  count:u32  count × delta
//! 11    HelloRefused          reason:u8          (acceptor to connector, then it closes)
//! 12    Challenge             magic "RLKP"  version:u32  nonce          (connector to acceptor)
//! 13    ChallengeAnswer       nonce  node:index  peers_fingerprint:u64  mac   (acceptor to connector)
//! 14    Proof                 node:index  peers_fingerprint:u64  mac  (connector to acceptor)
//!
//! delta = 1 key token:u64 lease_ms:u64 name  Grant
//!       | 2 key token:u64                  Release
//!       | 3 key token:u64 lease_ms:u64     Extend
//!       | 4 key token:u64                  Expire
//! ```
//!
//! # Peer secret
//!
//! Without `--peer-secret-file` a connection starts with the connector's
//! Hello, laid out as in version 3 (it names version 5 now: see
//! [`PROTOCOL_VERSION`]). With it, both sides
//! first prove that they hold the secret, and nothing else is read until
//! both proofs check:
//!
//! ```text
//! connector                                   acceptor
//!   Challenge(nonce_c)                  ->
//!                                       <-    ChallengeAnswer(nonce_a, acceptor's node, fingerprint, mac_a)
//!   Proof(connector's node, fingerprint, mac_c)  Hello  ->
//!
//! mac_x = HMAC-SHA256(secret, label_x 0x00 secured_version:u32 nonce_c nonce_a node:u8 peers_fingerprint:u64)
//! label_a = "ringlock/peer-proof/acceptor"   label_c = "ringlock/peer-proof/connector"
//! ```
//!
//! Each mac names the side that proves (its label and its node index), both
//! fresh nonces and the `--peers` fingerprint; the Hello that follows must
//! name the node and fingerprint the connector's Proof bound. The proof
//! itself is computed in `replication::proof`.
//!
//! The Challenge and the proofs name [`SECURED_PROTOCOL_VERSION`] (6);
//! the Hello after them, and every frame after it, are those of
//! [`PROTOCOL_VERSION`] (5). A node of version 3 reads a Challenge as a
//! first frame that is not a Hello and closes the connection.
//!
//! # Names
//!
//! A grant carries the authenticated name that took it (`name`, in Grant
//! deltas and snapshot entries), as its bytes: the numbers a node gives
//! names are its own (`node::names`). A receiver numbers the names it reads;
//! an empty name is no name (a server without client authentication).
//!
//! The rules [`decode`] enforces:
//! - `len` above [`FRAME_LEN_MAX`] is an error as soon as the four length
//!   bytes are there, so a broken peer never makes us wait for (or buffer)
//!   more than a megabyte. `len` 0 (no type byte) is [`WireError::Truncated`].
//! - Hello: the magic, `version` = [`PROTOCOL_VERSION`], `nodes` in
//!   `1..=NODES_MAX`, `node < nodes`.
//! - Every epoch (a Hello's or a heartbeat's `epoch` and `epoch_seen`, a
//!   HandOff's `epoch_seen`, a HandOffDone's `epoch`, and the `stream` of
//!   every table and deltas frame, which names an epoch) is at most
//!   `EPOCH_MAX` (2^24 - 1): no token can carry a larger one, and a node
//!   that learned one could never move above it.
//! - A HelloRefused reason is one of the four [`Refusal`]s.
//! - Challenge: the magic and `version` = [`SECURED_PROTOCOL_VERSION`].
//!   ChallengeAnswer and Proof: `node` below `NODES_MAX` (never "none").
//! - Heartbeat: `following` and `handing_off_to` below `NODES_MAX` or `0xFF`;
//!   a table that is absent (`has_table` 0) is sent as zeros, and zeros are
//!   required, so that the heartbeat keeps its fixed size and one encoding.
//! - A name is at most [`NAME_LEN_MAX`] bytes, and the receiver must have a
//!   number left for it (`node::names::NAMES_MAX`).
//! - Grant and Extend leases are `1..=LEASE_MS_LIMIT` ms; a snapshot entry's
//!   `lease_left_ms` is `0..=LEASE_MS_LIMIT` (0: it runs out now).
//! - `count` is at most [`ENTRIES_PER_FRAME_MAX`], and `first_version +
//!   count` fits in a `u64` (it is the table version after the frame).
//!
//! The largest legal chunk or deltas frame (1024 entries with 250-byte keys
//! and names) is about 530 KB, well below [`FRAME_LEN_MAX`].

use std::fmt;

use ringlock_proto::{KEY_LEN_MAX, NODES_MAX, is_valid_key};
use ringlock_shards::limits::LEASE_MS_LIMIT;
use ringlock_shards::token::EPOCH_MAX;
use ringlock_shards::{Delta, Key, NameId};

use crate::cluster::{Heartbeat, PeerMessage, PeerRole, TableVersion};

/// The peer protocol version a node speaks; a Hello with another is refused.
/// Version 2: a snapshot is sent in slices, with the deltas made meanwhile
/// between them (version 1 sent it whole, with no delta inside).
/// Version 3: a Hello carries the fingerprint of the sender's `--peers`, an
/// acceptor answers a Hello it refuses with HelloRefused, and epochs are
/// range-checked.
/// The peer secret did not change it (version 4 is version 3 behind the
/// proofs of the secret, see [`SECURED_PROTOCOL_VERSION`]).
/// Version 5: Grant deltas and snapshot entries carry the name that took
/// the grant, and a frame holds at most 1024 of them. A node of version 3
/// refuses a Hello of version 5 and the other way round, each logging both
/// versions: a cluster is upgraded to names all at once, not node by node.
pub const PROTOCOL_VERSION: u32 = 5;

/// The version a Challenge names and the proofs bind: [`PROTOCOL_VERSION`]
/// preceded by the exchange of proofs of the peer secret (Challenge,
/// ChallengeAnswer, Proof). Only a node with a peer secret sends it.
/// Version 4 preceded version 3; version 6 precedes version 5.
pub const SECURED_PROTOCOL_VERSION: u32 = 6;

/// The longest name a grant carries: that of an auth file's name.
pub const NAME_LEN_MAX: usize = crate::auth::NAME_LEN_MAX;

/// Longest frame, in bytes after the 4-byte length prefix.
pub const FRAME_LEN_MAX: usize = 1 << 20;

/// Most snapshot entries or deltas in one frame.
pub const ENTRIES_PER_FRAME_MAX: usize = 1024;

/// The first four payload bytes of a Hello, so that a connection from
/// something that is not a ringlock peer is told apart at once.
pub const HELLO_MAGIC: [u8; 4] = *b"RLKP";

/// The bytes of a whole Hello frame, length prefix included: all a peer
/// connection may send before it has said who it is.
pub const HELLO_FRAME_BYTES: usize = 40;

/// The bytes of a whole HelloRefused frame, length prefix included.
pub const HELLO_REFUSED_FRAME_BYTES: usize = 6;

/// The bytes of a nonce of the peer-secret exchange.
pub const NONCE_BYTES: usize = 32;

/// The bytes of an HMAC-SHA256 of the peer-secret exchange.
pub const MAC_BYTES: usize = 32;

/// The bytes of a whole Challenge frame, length prefix included: all a
/// connection to a node with a peer secret may send before it is answered.
pub const CHALLENGE_FRAME_BYTES: usize = 45;

/// The bytes of a whole ChallengeAnswer frame, length prefix included.
pub const CHALLENGE_ANSWER_FRAME_BYTES: usize = 78;

/// The bytes of a whole Proof frame, length prefix included.
pub const PROOF_FRAME_BYTES: usize = 46;

/// The bytes of the length prefix.
const LEN_PREFIX_BYTES: usize = 4;

/// The index byte that stands for `None`.
const INDEX_NONE: u8 = 0xFF;

// The "none" byte must never be a valid index.
const _: () = assert!(NODES_MAX < INDEX_NONE as usize);

/// Frame type bytes.
mod frame_type {
    pub const HELLO: u8 = 1;
    pub const HEARTBEAT: u8 = 2;
    pub const SNAPSHOT_REQUEST: u8 = 3;
    pub const HAND_OFF: u8 = 4;
    pub const HAND_OFF_DONE: u8 = 5;
    pub const HAND_OFF_REFUSED: u8 = 6;
    pub const SNAPSHOT_BEGIN: u8 = 7;
    pub const SNAPSHOT_CHUNK: u8 = 8;
    pub const SNAPSHOT_END: u8 = 9;
    pub const DELTAS: u8 = 10;
    pub const HELLO_REFUSED: u8 = 11;
    pub const CHALLENGE: u8 = 12;
    pub const CHALLENGE_ANSWER: u8 = 13;
    pub const PROOF: u8 = 14;
}

/// Delta kind bytes.
mod delta_kind {
    pub const GRANT: u8 = 1;
    pub const RELEASE: u8 = 2;
    pub const EXTEND: u8 = 3;
    pub const EXPIRE: u8 = 4;
}

/// Role bytes.
mod role_byte {
    pub const ACTIVE: u8 = 1;
    pub const STANDBY: u8 = 2;
    pub const LEAVING: u8 = 3;
}

/// Fewest payload bytes one snapshot entry takes (a one-byte key).
const SNAPSHOT_ENTRY_BYTES_MIN: usize = 1 + 1 + 8 + 8 + 1;
/// Most payload bytes one snapshot entry takes.
const SNAPSHOT_ENTRY_BYTES_MAX: usize = 1 + KEY_LEN_MAX + 8 + 8 + 1 + NAME_LEN_MAX;
/// Fewest payload bytes one delta takes (a release or expire of a one-byte key).
const DELTA_BYTES_MIN: usize = 1 + 1 + 1 + 8;
/// Most payload bytes one delta takes (a grant or extend of a 250-byte key).
const DELTA_BYTES_MAX: usize = 1 + 1 + KEY_LEN_MAX + 8 + 8 + 1 + NAME_LEN_MAX;

// A full chunk or deltas frame of the longest keys must fit in one frame,
// or the encoders could produce frames their peer refuses.
const _: () = assert!(1 + 4 + ENTRIES_PER_FRAME_MAX * SNAPSHOT_ENTRY_BYTES_MAX <= FRAME_LEN_MAX);
const _: () = assert!(1 + 8 + 8 + 4 + ENTRIES_PER_FRAME_MAX * DELTA_BYTES_MAX <= FRAME_LEN_MAX);

/// The first frame on every peer connection, sent by the node that connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The sender's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The cluster size the sender was started with (`--peers`).
    pub nodes: usize,
    /// The sender's index in `--peers`.
    pub node: usize,
    /// The sender's incarnation (grows across its restarts).
    pub incarnation: u64,
    /// The sender's epoch.
    pub epoch: u64,
    /// The sender's role.
    pub role: PeerRole,
    /// [`peers_fingerprint`] of the sender's `--peers`: nodes given
    /// different lists (another order, another client address) refuse each
    /// other.
    pub peers_fingerprint: u64,
}

/// Why an acceptor refused a well-formed Hello. The connector is told, so
/// that a node whose peers refuse it knows its settings disagree with theirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The Hello names another cluster size.
    Nodes,
    /// The Hello names the acceptor's own index.
    SameNode,
    /// The Hello's `--peers` fingerprint differs from the acceptor's.
    PeerList,
}

impl Refusal {
    fn to_byte(self) -> u8 {
        match self {
            Refusal::Nodes => 1,
            Refusal::SameNode => 2,
            Refusal::PeerList => 3,
        }
    }

    fn from_byte(byte: u8) -> Option<Refusal> {
        match byte {
            1 => Some(Refusal::Nodes),
            2 => Some(Refusal::SameNode),
            3 => Some(Refusal::PeerList),
            _ => None,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::Nodes => "its --peers lists another number of nodes",
            Refusal::SameNode => "it has the same --node index",
            Refusal::PeerList => "its --peers differs (other client addresses or another order)",
        })
    }
}

/// A fingerprint of the ordered peer list: FNV-1a (64 bits) over the
/// entries' client addresses, separated by `,`. Those are what every node
/// must agree on (the order is the priority, and `P` and `M` name them);
/// the peer addresses are each node's own way to reach the others, which
/// may differ (a proxy, another network). It needs no secrecy, only to
/// differ when the lists do, and to be the same on every build and host.
pub fn peers_fingerprint<T: std::fmt::Display>(clients: impl IntoIterator<Item = T>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let text: Vec<String> = clients.into_iter().map(|client| client.to_string()).collect();
    text.join(",").bytes().fold(OFFSET, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME))
}

/// What one side of a peer connection proves with the peer secret: that it
/// is node `node` of a cluster whose `--peers` has this fingerprint, for the
/// nonces of this connection (`mac`, see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proof {
    /// The index of the side that proves.
    pub node: usize,
    /// [`peers_fingerprint`] of that side's `--peers`.
    pub peers_fingerprint: u64,
    /// HMAC-SHA256 over the label of that side, the nonces, `node` and
    /// `peers_fingerprint`.
    pub mac: [u8; MAC_BYTES],
}

/// One held lock of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// The key.
    pub key: Key,
    /// The token it is held with.
    pub token: u64,
    /// The lease left when the snapshot was taken, in ms.
    pub lease_left_ms: u64,
    /// The name that took the grant, numbered by this node.
    pub name: NameId,
}

/// One frame of the peer protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// The first frame on every peer connection (connector to acceptor).
    Hello(Hello),
    /// A control message of the cluster protocol.
    Message(PeerMessage),
    /// A snapshot starts at `table`. Chunks follow, and between them the
    /// deltas made meanwhile, numbered on from `table`'s version, in the
    /// order the active made both.
    SnapshotBegin {
        /// The stream and version the snapshot starts at.
        table: TableVersion,
    },
    /// Some entries of the snapshot under way, each the key's state when
    /// the chunk was sent: it replaces what the receiver has for the key.
    SnapshotChunk(Vec<SnapshotEntry>),
    /// The snapshot is complete, and with the deltas received since its
    /// begin the table is at `table`.
    SnapshotEnd {
        /// The stream and version the table is at.
        table: TableVersion,
    },
    /// Deltas of the active's stream, numbered `first_version`,
    /// `first_version + 1`, ...
    Deltas {
        /// The stream the deltas belong to.
        stream: u64,
        /// The number of the first delta (the table version it applies to).
        first_version: u64,
        /// The deltas in order.
        deltas: Vec<Delta>,
    },
    /// The acceptor refused the connector's Hello, for this reason, and
    /// closes the connection.
    HelloRefused(Refusal),
    /// With a peer secret, the first frame of a connection: the connector's
    /// fresh nonce, which the acceptor's proof must cover.
    Challenge {
        /// The connector's nonce.
        nonce: [u8; NONCE_BYTES],
    },
    /// The acceptor's answer to a Challenge: its own fresh nonce, which the
    /// connector's proof must cover, and its proof (the only frame an
    /// acceptor sends besides HelloRefused).
    ChallengeAnswer {
        /// The acceptor's nonce.
        nonce: [u8; NONCE_BYTES],
        /// The acceptor's proof.
        proof: Proof,
    },
    /// The connector's proof, sent once the acceptor's checked; its Hello
    /// follows.
    Proof(Proof),
}

/// Why a peer's bytes are not a frame. Any of them means the peer is broken
/// (or not a ringlock peer of this version); the connection is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The length prefix is above [`FRAME_LEN_MAX`].
    FrameTooLong {
        /// The announced length, in bytes.
        len: usize,
    },
    /// The frame type byte is not one of the protocol's.
    UnknownType(u8),
    /// The frame ends before its fields do.
    Truncated,
    /// The frame goes on after its last field.
    TrailingBytes,
    /// A Hello does not start with [`HELLO_MAGIC`].
    BadMagic([u8; 4]),
    /// A Hello of another protocol version.
    BadVersion(u32),
    /// A Challenge of another version than [`SECURED_PROTOCOL_VERSION`].
    BadChallengeVersion(u32),
    /// A Hello's cluster size is not `1..=NODES_MAX`.
    BadNodes(u8),
    /// A node index is out of range.
    BadIndex(u8),
    /// A role byte is not one of the three roles.
    BadRole(u8),
    /// A flag byte is neither 0 nor 1.
    BadFlag(u8),
    /// An absent heartbeat table is not sent as zeros.
    AbsentTableNotZero,
    /// A key is empty, longer than 250 bytes, or holds a forbidden byte.
    BadKey,
    /// A name is longer than [`NAME_LEN_MAX`].
    BadName,
    /// A name is new and this node has numbered as many as it can.
    TooManyNames,
    /// A lease is out of range (0 or above the limit for a grant or extend,
    /// above the limit for a snapshot entry).
    BadLease(u64),
    /// A delta kind byte is not one of the four kinds.
    BadDeltaKind(u8),
    /// A chunk or deltas frame announces more than [`ENTRIES_PER_FRAME_MAX`].
    TooManyEntries(u32),
    /// A deltas frame numbers deltas past `u64::MAX`.
    VersionOverflow,
    /// An epoch above `EPOCH_MAX`.
    BadEpoch(u64),
    /// A HelloRefused reason byte is not one of the known reasons.
    BadRefusal(u8),
}

/// What a proof's node index may be: a node, never "none".
fn proof_node(byte: u8) -> Result<usize, WireError> {
    if usize::from(byte) < NODES_MAX { Ok(usize::from(byte)) } else { Err(WireError::BadIndex(byte)) }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::FrameTooLong { len } => {
                write!(f, "frame of {len} bytes announced; the limit is {FRAME_LEN_MAX}")
            }
            WireError::UnknownType(byte) => write!(f, "unknown frame type {byte}"),
            WireError::Truncated => write!(f, "frame shorter than its fields"),
            WireError::TrailingBytes => write!(f, "frame longer than its fields"),
            WireError::BadMagic(magic) => {
                write!(f, "hello or challenge starts with {magic:02x?}, not {HELLO_MAGIC:02x?}: not a ringlock peer")
            }
            WireError::BadVersion(version) => {
                write!(f, "peer speaks protocol version {version}; this node speaks {PROTOCOL_VERSION}")
            }
            WireError::BadChallengeVersion(version) => write!(
                f,
                "peer's challenge names protocol version {version}; this node's peer secret speaks \
                 {SECURED_PROTOCOL_VERSION}"
            ),
            WireError::BadNodes(nodes) => write!(f, "cluster size {nodes} is not between 1 and {NODES_MAX}"),
            WireError::BadIndex(index) => write!(f, "node index {index} out of range"),
            WireError::BadRole(byte) => write!(f, "unknown role {byte}"),
            WireError::BadFlag(byte) => write!(f, "flag byte {byte} is neither 0 nor 1"),
            WireError::AbsentTableNotZero => write!(f, "heartbeat without a table has non-zero table fields"),
            WireError::BadKey => {
                write!(f, "key is empty, longer than {KEY_LEN_MAX} bytes, or holds space, tab, CR, LF or NUL")
            }
            WireError::BadLease(lease_ms) => write!(f, "lease of {lease_ms} ms out of range"),
            WireError::BadName => write!(f, "a grant's name is longer than {NAME_LEN_MAX} bytes"),
            WireError::TooManyNames => write!(
                f,
                "a grant's name is new and this node has numbered {} names already",
                crate::node::names::NAMES_MAX
            ),
            WireError::BadDeltaKind(byte) => write!(f, "unknown delta kind {byte}"),
            WireError::TooManyEntries(count) => {
                write!(f, "{count} entries in one frame; the limit is {ENTRIES_PER_FRAME_MAX}")
            }
            WireError::VersionOverflow => write!(f, "delta versions run past the largest u64"),
            WireError::BadEpoch(epoch) => write!(f, "epoch {epoch} out of range (the largest is {EPOCH_MAX})"),
            WireError::BadRefusal(byte) => write!(f, "unknown refusal reason {byte}"),
        }
    }
}

impl std::error::Error for WireError {}

// ---------------------------------------------------------------------------
// Encoding

/// Appends one frame to `out`.
///
/// # Panics
///
/// On a frame that [`decode`] would refuse for a limit (an index, a key, a
/// lease or a count out of range). Key bytes and delta numbering are checked
/// in debug builds only.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    match frame {
        Frame::Hello(hello) => encode_hello(hello, out),
        Frame::Message(message) => encode_message(message, out),
        Frame::SnapshotBegin { table } => encode_table_frame(frame_type::SNAPSHOT_BEGIN, *table, out),
        Frame::SnapshotChunk(entries) => encode_snapshot_chunk(entries, out),
        Frame::SnapshotEnd { table } => encode_table_frame(frame_type::SNAPSHOT_END, *table, out),
        Frame::Deltas { stream, first_version, deltas } => encode_deltas(*stream, *first_version, deltas, out),
        Frame::HelloRefused(refusal) => {
            let start = begin_frame(frame_type::HELLO_REFUSED, out);
            out.push(refusal.to_byte());
            end_frame(start, out);
        }
        Frame::Challenge { nonce } => {
            let start = begin_frame(frame_type::CHALLENGE, out);
            out.extend_from_slice(&HELLO_MAGIC);
            put_u32(SECURED_PROTOCOL_VERSION, out);
            out.extend_from_slice(nonce);
            end_frame(start, out);
        }
        Frame::ChallengeAnswer { nonce, proof } => {
            let start = begin_frame(frame_type::CHALLENGE_ANSWER, out);
            out.extend_from_slice(nonce);
            put_proof(proof, out);
            end_frame(start, out);
        }
        Frame::Proof(proof) => {
            let start = begin_frame(frame_type::PROOF, out);
            put_proof(proof, out);
            end_frame(start, out);
        }
    }
}

fn put_proof(proof: &Proof, out: &mut Vec<u8>) {
    assert!(proof.node < NODES_MAX, "proof of node {}", proof.node);
    out.push(proof.node as u8);
    put_u64(proof.peers_fingerprint, out);
    out.extend_from_slice(&proof.mac);
}

/// Appends a [`Frame::Message`] to `out`, without building the frame.
pub fn encode_message(message: &PeerMessage, out: &mut Vec<u8>) {
    match message {
        PeerMessage::Heartbeat(heartbeat) => encode_heartbeat(heartbeat, out),
        PeerMessage::SnapshotRequest => {
            let start = begin_frame(frame_type::SNAPSHOT_REQUEST, out);
            end_frame(start, out);
        }
        PeerMessage::HandOff { table, epoch_seen } => {
            let start = begin_frame(frame_type::HAND_OFF, out);
            put_table(*table, out);
            put_u64(*epoch_seen, out);
            end_frame(start, out);
        }
        PeerMessage::HandOffDone { table, epoch } => {
            let start = begin_frame(frame_type::HAND_OFF_DONE, out);
            put_table(*table, out);
            put_u64(*epoch, out);
            end_frame(start, out);
        }
        PeerMessage::HandOffRefused { table } => encode_table_frame(frame_type::HAND_OFF_REFUSED, *table, out),
    }
}

/// Appends a [`Frame::Deltas`] to `out`, from a slice of the caller's queue.
///
/// # Panics
///
/// If `deltas` holds more than [`ENTRIES_PER_FRAME_MAX`], or one of them has
/// an out-of-range lease or key length.
pub fn encode_deltas(stream: u64, first_version: u64, deltas: &[Delta], out: &mut Vec<u8>) {
    assert!(deltas.len() <= ENTRIES_PER_FRAME_MAX, "{} deltas in one frame", deltas.len());
    debug_assert!(first_version.checked_add(deltas.len() as u64).is_some());
    let start = begin_frame(frame_type::DELTAS, out);
    put_u64(stream, out);
    put_u64(first_version, out);
    put_u32(deltas.len() as u32, out);
    for delta in deltas {
        match delta {
            Delta::Grant { key, token, lease_ms, name } => {
                put_delta_with_lease(delta_kind::GRANT, key, *token, *lease_ms, out);
                put_name(*name, out);
            }
            Delta::Release { key, token } => put_delta(delta_kind::RELEASE, key, *token, out),
            Delta::Extend { key, token, lease_ms } => {
                put_delta_with_lease(delta_kind::EXTEND, key, *token, *lease_ms, out)
            }
            Delta::Expire { key, token } => put_delta(delta_kind::EXPIRE, key, *token, out),
        }
    }
    end_frame(start, out);
}

/// Appends a [`Frame::SnapshotChunk`] to `out`, from a slice of entries.
///
/// # Panics
///
/// If `entries` holds more than [`ENTRIES_PER_FRAME_MAX`], or one of them has
/// a lease above the limit or an out-of-range key length.
pub fn encode_snapshot_chunk(entries: &[SnapshotEntry], out: &mut Vec<u8>) {
    assert!(entries.len() <= ENTRIES_PER_FRAME_MAX, "{} snapshot entries in one frame", entries.len());
    let start = begin_frame(frame_type::SNAPSHOT_CHUNK, out);
    put_u32(entries.len() as u32, out);
    for entry in entries {
        assert!(entry.lease_left_ms <= LEASE_MS_LIMIT, "snapshot lease of {} ms", entry.lease_left_ms);
        put_key(&entry.key, out);
        put_u64(entry.token, out);
        put_u64(entry.lease_left_ms, out);
        put_name(entry.name, out);
    }
    end_frame(start, out);
}

fn encode_hello(hello: &Hello, out: &mut Vec<u8>) {
    assert!((1..=NODES_MAX).contains(&hello.nodes), "hello with {} nodes", hello.nodes);
    assert!(hello.node < hello.nodes, "hello from node {} of {}", hello.node, hello.nodes);
    let start = begin_frame(frame_type::HELLO, out);
    out.extend_from_slice(&HELLO_MAGIC);
    put_u32(hello.version, out);
    out.push(hello.nodes as u8);
    out.push(hello.node as u8);
    put_u64(hello.incarnation, out);
    put_u64(hello.epoch, out);
    out.push(role_to_byte(hello.role));
    put_u64(hello.peers_fingerprint, out);
    end_frame(start, out);
}

fn encode_heartbeat(heartbeat: &Heartbeat, out: &mut Vec<u8>) {
    let start = begin_frame(frame_type::HEARTBEAT, out);
    put_u64(heartbeat.incarnation, out);
    put_u64(heartbeat.sequence, out);
    out.push(role_to_byte(heartbeat.role));
    put_u64(heartbeat.epoch, out);
    put_u64(heartbeat.epoch_seen, out);
    put_index(heartbeat.following, out);
    out.push(u8::from(heartbeat.caught_up));
    out.push(u8::from(heartbeat.table.is_some()));
    put_table(heartbeat.table.unwrap_or(TableVersion { stream: 0, version: 0 }), out);
    put_index(heartbeat.handing_off_to, out);
    end_frame(start, out);
}

fn encode_table_frame(type_byte: u8, table: TableVersion, out: &mut Vec<u8>) {
    let start = begin_frame(type_byte, out);
    put_table(table, out);
    end_frame(start, out);
}

/// Appends a length placeholder and the type byte; returns where the length goes.
fn begin_frame(type_byte: u8, out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_PREFIX_BYTES]);
    out.push(type_byte);
    start
}

/// Writes the length of the frame that starts at `start`.
fn end_frame(start: usize, out: &mut [u8]) {
    let len = out.len() - start - LEN_PREFIX_BYTES;
    debug_assert!(len <= FRAME_LEN_MAX);
    out[start..start + LEN_PREFIX_BYTES].copy_from_slice(&(len as u32).to_le_bytes());
}

fn put_u32(value: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(value: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_table(table: TableVersion, out: &mut Vec<u8>) {
    put_u64(table.stream, out);
    put_u64(table.version, out);
}

fn put_index(index: Option<usize>, out: &mut Vec<u8>) {
    match index {
        Some(index) => {
            assert!(index < NODES_MAX, "node index {index}");
            out.push(index as u8);
        }
        None => out.push(INDEX_NONE),
    }
}

fn put_key(key: &Key, out: &mut Vec<u8>) {
    let bytes = key.as_bytes();
    assert!((1..=KEY_LEN_MAX).contains(&bytes.len()), "key of {} bytes", bytes.len());
    debug_assert!(is_valid_key(bytes), "invalid key {key:?}");
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

/// A grant's name, as its bytes: numbers are each node's own.
fn put_name(name: NameId, out: &mut Vec<u8>) {
    let Some(bytes) = crate::node::names::name_of(name) else {
        out.push(0);
        return;
    };
    assert!(bytes.len() <= NAME_LEN_MAX, "name of {} bytes", bytes.len());
    out.push(bytes.len() as u8);
    out.extend_from_slice(&bytes);
}

fn put_delta(kind: u8, key: &Key, token: u64, out: &mut Vec<u8>) {
    out.push(kind);
    put_key(key, out);
    put_u64(token, out);
}

fn put_delta_with_lease(kind: u8, key: &Key, token: u64, lease_ms: u64, out: &mut Vec<u8>) {
    assert!((1..=LEASE_MS_LIMIT).contains(&lease_ms), "delta lease of {lease_ms} ms");
    put_delta(kind, key, token, out);
    put_u64(lease_ms, out);
}

fn role_to_byte(role: PeerRole) -> u8 {
    match role {
        PeerRole::Active => role_byte::ACTIVE,
        PeerRole::Standby => role_byte::STANDBY,
        PeerRole::Leaving => role_byte::LEAVING,
    }
}

// ---------------------------------------------------------------------------
// Decoding

/// Decodes the frame at the start of `input`.
///
/// `Ok(None)`: not a whole frame yet (read more). `Ok(Some((frame,
/// bytes_used)))`: one frame, and the bytes it took (drop them). `Err`: the
/// peer is broken; the caller closes the connection.
///
/// It never panics, and allocates only for what the frame's bytes hold: a
/// count is trusted for capacity only as far as the frame has bytes for
/// that many entries.
pub fn decode(input: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
    let Some((len_bytes, rest)) = input.split_first_chunk::<LEN_PREFIX_BYTES>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(*len_bytes) as usize;
    if len > FRAME_LEN_MAX {
        return Err(WireError::FrameTooLong { len });
    }
    let Some(body) = rest.get(..len) else {
        return Ok(None);
    };
    let mut reader = Reader { bytes: body };
    let frame = match reader.u8()? {
        frame_type::HELLO => Frame::Hello(read_hello(&mut reader)?),
        frame_type::HEARTBEAT => Frame::Message(PeerMessage::Heartbeat(read_heartbeat(&mut reader)?)),
        frame_type::SNAPSHOT_REQUEST => Frame::Message(PeerMessage::SnapshotRequest),
        frame_type::HAND_OFF => {
            Frame::Message(PeerMessage::HandOff { table: reader.table()?, epoch_seen: reader.epoch()? })
        }
        frame_type::HAND_OFF_DONE => {
            Frame::Message(PeerMessage::HandOffDone { table: reader.table()?, epoch: reader.epoch()? })
        }
        frame_type::HAND_OFF_REFUSED => Frame::Message(PeerMessage::HandOffRefused { table: reader.table()? }),
        frame_type::SNAPSHOT_BEGIN => Frame::SnapshotBegin { table: reader.table()? },
        frame_type::SNAPSHOT_CHUNK => Frame::SnapshotChunk(read_snapshot_chunk(&mut reader)?),
        frame_type::SNAPSHOT_END => Frame::SnapshotEnd { table: reader.table()? },
        frame_type::DELTAS => read_deltas(&mut reader)?,
        frame_type::HELLO_REFUSED => {
            let byte = reader.u8()?;
            Frame::HelloRefused(Refusal::from_byte(byte).ok_or(WireError::BadRefusal(byte))?)
        }
        frame_type::CHALLENGE => {
            let version = read_magic_and_version(&mut reader)?;
            if version != SECURED_PROTOCOL_VERSION {
                return Err(WireError::BadChallengeVersion(version));
            }
            Frame::Challenge { nonce: reader.array()? }
        }
        frame_type::CHALLENGE_ANSWER => {
            Frame::ChallengeAnswer { nonce: reader.array()?, proof: read_proof(&mut reader)? }
        }
        frame_type::PROOF => Frame::Proof(read_proof(&mut reader)?),
        other => return Err(WireError::UnknownType(other)),
    };
    if !reader.bytes.is_empty() {
        return Err(WireError::TrailingBytes);
    }
    Ok(Some((frame, LEN_PREFIX_BYTES + len)))
}

/// The magic a Hello and a Challenge start with, and the version after it.
fn read_magic_and_version(reader: &mut Reader<'_>) -> Result<u32, WireError> {
    let magic = reader.array::<4>()?;
    if magic != HELLO_MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    reader.u32()
}

fn read_proof(reader: &mut Reader<'_>) -> Result<Proof, WireError> {
    Ok(Proof { node: proof_node(reader.u8()?)?, peers_fingerprint: reader.u64()?, mac: reader.array()? })
}

fn read_hello(reader: &mut Reader<'_>) -> Result<Hello, WireError> {
    let version = read_magic_and_version(reader)?;
    if version != PROTOCOL_VERSION {
        return Err(WireError::BadVersion(version));
    }
    let nodes = reader.u8()?;
    if !(1..=NODES_MAX).contains(&usize::from(nodes)) {
        return Err(WireError::BadNodes(nodes));
    }
    let node = reader.u8()?;
    if node >= nodes {
        return Err(WireError::BadIndex(node));
    }
    Ok(Hello {
        version,
        nodes: usize::from(nodes),
        node: usize::from(node),
        incarnation: reader.u64()?,
        epoch: reader.epoch()?,
        role: reader.role()?,
        peers_fingerprint: reader.u64()?,
    })
}

fn read_heartbeat(reader: &mut Reader<'_>) -> Result<Heartbeat, WireError> {
    let incarnation = reader.u64()?;
    let sequence = reader.u64()?;
    let role = reader.role()?;
    let epoch = reader.epoch()?;
    let epoch_seen = reader.epoch()?;
    let following = reader.index()?;
    let caught_up = reader.flag()?;
    let has_table = reader.flag()?;
    let table = reader.table()?;
    let table = if has_table {
        Some(table)
    } else if table.stream != 0 || table.version != 0 {
        return Err(WireError::AbsentTableNotZero);
    } else {
        None
    };
    let handing_off_to = reader.index()?;
    Ok(Heartbeat { incarnation, sequence, role, epoch, epoch_seen, following, caught_up, table, handing_off_to })
}

fn read_snapshot_chunk(reader: &mut Reader<'_>) -> Result<Vec<SnapshotEntry>, WireError> {
    let count = reader.count()?;
    let mut entries = Vec::with_capacity(reader.capacity_for(count, SNAPSHOT_ENTRY_BYTES_MIN));
    for _ in 0..count {
        let key = reader.key()?;
        let token = reader.u64()?;
        let lease_left_ms = reader.u64()?;
        if lease_left_ms > LEASE_MS_LIMIT {
            return Err(WireError::BadLease(lease_left_ms));
        }
        let name = reader.name()?;
        entries.push(SnapshotEntry { key, token, lease_left_ms, name });
    }
    Ok(entries)
}

fn read_deltas(reader: &mut Reader<'_>) -> Result<Frame, WireError> {
    let stream = reader.epoch()?;
    let first_version = reader.u64()?;
    let count = reader.count()?;
    if first_version.checked_add(count as u64).is_none() {
        return Err(WireError::VersionOverflow);
    }
    let mut deltas = Vec::with_capacity(reader.capacity_for(count, DELTA_BYTES_MIN));
    for _ in 0..count {
        let kind = reader.u8()?;
        if !(delta_kind::GRANT..=delta_kind::EXPIRE).contains(&kind) {
            return Err(WireError::BadDeltaKind(kind));
        }
        let key = reader.key()?;
        let token = reader.u64()?;
        let delta = match kind {
            delta_kind::GRANT => Delta::Grant { key, token, lease_ms: reader.lease_ms()?, name: reader.name()? },
            delta_kind::RELEASE => Delta::Release { key, token },
            delta_kind::EXTEND => Delta::Extend { key, token, lease_ms: reader.lease_ms()? },
            _ => Delta::Expire { key, token },
        };
        deltas.push(delta);
    }
    Ok(Frame::Deltas { stream, first_version, deltas })
}

/// The unread payload of one whole frame.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (head, rest) = self.bytes.split_first_chunk::<N>().ok_or(WireError::Truncated)?;
        self.bytes = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A table: its stream is named by an epoch.
    fn table(&mut self) -> Result<TableVersion, WireError> {
        Ok(TableVersion { stream: self.epoch()?, version: self.u64()? })
    }

    fn epoch(&mut self) -> Result<u64, WireError> {
        let epoch = self.u64()?;
        if epoch > EPOCH_MAX {
            return Err(WireError::BadEpoch(epoch));
        }
        Ok(epoch)
    }

    fn flag(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(WireError::BadFlag(other)),
        }
    }

    fn role(&mut self) -> Result<PeerRole, WireError> {
        match self.u8()? {
            role_byte::ACTIVE => Ok(PeerRole::Active),
            role_byte::STANDBY => Ok(PeerRole::Standby),
            role_byte::LEAVING => Ok(PeerRole::Leaving),
            other => Err(WireError::BadRole(other)),
        }
    }

    /// An optional node index.
    fn index(&mut self) -> Result<Option<usize>, WireError> {
        match self.u8()? {
            INDEX_NONE => Ok(None),
            index if usize::from(index) < NODES_MAX => Ok(Some(usize::from(index))),
            other => Err(WireError::BadIndex(other)),
        }
    }

    /// A grant's name, numbered on this node.
    fn name(&mut self) -> Result<NameId, WireError> {
        let len = usize::from(self.u8()?);
        if len == 0 {
            return Ok(NameId::NONE);
        }
        if len > NAME_LEN_MAX {
            return Err(WireError::BadName);
        }
        let bytes = self.bytes.get(..len).ok_or(WireError::Truncated)?;
        self.bytes = &self.bytes[len..];
        crate::node::names::intern(bytes).ok_or(WireError::TooManyNames)
    }

    fn key(&mut self) -> Result<Key, WireError> {
        let len = usize::from(self.u8()?);
        if !(1..=KEY_LEN_MAX).contains(&len) {
            return Err(WireError::BadKey);
        }
        let bytes = self.bytes.get(..len).ok_or(WireError::Truncated)?;
        self.bytes = &self.bytes[len..];
        if !is_valid_key(bytes) {
            return Err(WireError::BadKey);
        }
        Ok(Key::new(bytes))
    }

    /// A Grant or Extend lease.
    fn lease_ms(&mut self) -> Result<u64, WireError> {
        let lease_ms = self.u64()?;
        if !(1..=LEASE_MS_LIMIT).contains(&lease_ms) {
            return Err(WireError::BadLease(lease_ms));
        }
        Ok(lease_ms)
    }

    /// An entry count, at most [`ENTRIES_PER_FRAME_MAX`].
    fn count(&mut self) -> Result<usize, WireError> {
        let count = self.u32()?;
        if count as usize > ENTRIES_PER_FRAME_MAX {
            return Err(WireError::TooManyEntries(count));
        }
        Ok(count as usize)
    }

    /// How many of `count` entries, each at least `entry_bytes_min` bytes,
    /// the rest of the frame can hold: the capacity worth allocating up front.
    fn capacity_for(&self, count: usize, entry_bytes_min: usize) -> usize {
        count.min(self.bytes.len() / entry_bytes_min)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Where a frame's payload starts: after the length and the type byte.
    const PAYLOAD_AT: usize = LEN_PREFIX_BYTES + 1;

    fn encoded(frame: &Frame) -> Vec<u8> {
        let mut out = Vec::new();
        encode(frame, &mut out);
        out
    }

    /// A frame of `type_byte` and `payload`, with its length prefix.
    fn raw_frame(type_byte: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = ((1 + payload.len()) as u32).to_le_bytes().to_vec();
        out.push(type_byte);
        out.extend_from_slice(payload);
        out
    }

    fn table(stream: u64, version: u64) -> TableVersion {
        TableVersion { stream, version }
    }

    fn hello() -> Frame {
        Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            nodes: 3,
            node: 2,
            incarnation: 7,
            epoch: 0x00ab_cdef,
            role: PeerRole::Standby,
            peers_fingerprint: 0x1234_5678_9abc_def0,
        })
    }

    fn heartbeat() -> Heartbeat {
        Heartbeat {
            incarnation: 3,
            sequence: 99,
            role: PeerRole::Active,
            epoch: 33,
            epoch_seen: 49,
            following: Some(1),
            caught_up: true,
            table: Some(table(33, 1_000_000)),
            handing_off_to: Some(15),
        }
    }

    fn entry(key: &[u8], token: u64, lease_left_ms: u64) -> SnapshotEntry {
        SnapshotEntry { key: Key::new(key), token, lease_left_ms, name: NameId::NONE }
    }

    /// A name numbered on this node, as a grant records it.
    fn name(name: &str) -> NameId {
        crate::node::names::intern(name.as_bytes()).unwrap()
    }

    /// One frame of every type, and every delta kind.
    fn one_of_each() -> Vec<Frame> {
        vec![
            hello(),
            Frame::Message(PeerMessage::Heartbeat(heartbeat())),
            Frame::Message(PeerMessage::Heartbeat(Heartbeat {
                role: PeerRole::Standby,
                following: None,
                caught_up: false,
                table: None,
                handing_off_to: None,
                ..heartbeat()
            })),
            Frame::Message(PeerMessage::SnapshotRequest),
            Frame::Message(PeerMessage::HandOff { table: table(17, 5), epoch_seen: 50 }),
            Frame::Message(PeerMessage::HandOffDone { table: table(17, 5), epoch: 66 }),
            Frame::Message(PeerMessage::HandOffRefused { table: table(17, 5) }),
            Frame::SnapshotBegin { table: table(17, 0) },
            Frame::SnapshotChunk(vec![
                entry(b"a", 1, 0),
                entry(&[b'k'; KEY_LEN_MAX], u64::MAX, LEASE_MS_LIMIT),
                SnapshotEntry { name: name(&"n".repeat(NAME_LEN_MAX)), ..entry(b"b", 2, 3) },
            ]),
            Frame::SnapshotChunk(Vec::new()),
            Frame::SnapshotEnd { table: table(17, 0) },
            Frame::Deltas {
                stream: 17,
                first_version: 0,
                deltas: vec![
                    Delta::Grant { key: Key::new(b"orders/42"), token: 5, lease_ms: 1, name: NameId::NONE },
                    Delta::Grant { key: Key::new(b"orders/43"), token: 6, lease_ms: 2, name: name("wire-alpha") },
                    Delta::Release { key: Key::new(b"orders/42"), token: 5 },
                    Delta::Extend { key: Key::new("clé".as_bytes()), token: 6, lease_ms: LEASE_MS_LIMIT },
                    Delta::Expire { key: Key::new(&[0xFF; 30]), token: 6 },
                ],
            },
            Frame::Deltas { stream: 0, first_version: u64::MAX, deltas: Vec::new() },
            Frame::Deltas { stream: EPOCH_MAX, first_version: 1, deltas: Vec::new() },
            Frame::HelloRefused(Refusal::Nodes),
            Frame::HelloRefused(Refusal::SameNode),
            Frame::HelloRefused(Refusal::PeerList),
            Frame::Challenge { nonce: [0xC5; NONCE_BYTES] },
            Frame::ChallengeAnswer { nonce: [0xA5; NONCE_BYTES], proof: proof(1) },
            Frame::Proof(proof(NODES_MAX - 1)),
        ]
    }

    fn proof(node: usize) -> Proof {
        Proof { node, peers_fingerprint: 0x1234_5678_9abc_def0, mac: [0x3C; MAC_BYTES] }
    }

    fn deltas_frame(deltas: Vec<Delta>) -> Frame {
        Frame::Deltas { stream: 1, first_version: 10, deltas }
    }

    fn grant(key: &[u8], lease_ms: u64) -> Delta {
        Delta::Grant { key: Key::new(key), token: 1, lease_ms, name: NameId::NONE }
    }

    // -- Round trips and framing --------------------------------------------

    #[test]
    fn every_frame_type_round_trips() {
        for frame in one_of_each() {
            let bytes = encoded(&frame);
            assert_eq!(decode(&bytes), Ok(Some((frame.clone(), bytes.len()))), "{frame:?}");
        }
    }

    #[test]
    fn encode_message_matches_encode_of_the_frame() {
        let message = PeerMessage::Heartbeat(heartbeat());
        let mut out = Vec::new();
        encode_message(&message, &mut out);
        assert_eq!(out, encoded(&Frame::Message(message)));
    }

    #[test]
    fn fixed_size_frames_have_the_documented_sizes() {
        assert_eq!(encoded(&hello()).len(), PAYLOAD_AT + 35);
        assert_eq!(encoded(&Frame::HelloRefused(Refusal::PeerList)).len(), HELLO_REFUSED_FRAME_BYTES);
        assert_eq!(encoded(&hello()).len(), HELLO_FRAME_BYTES);
        assert_eq!(encoded(&Frame::Message(PeerMessage::Heartbeat(heartbeat()))).len(), PAYLOAD_AT + 53);
        assert_eq!(encoded(&Frame::Message(PeerMessage::SnapshotRequest)).len(), PAYLOAD_AT);
        assert_eq!(encoded(&Frame::SnapshotBegin { table: table(1, 2) }).len(), PAYLOAD_AT + 16);
        assert_eq!(encoded(&Frame::Challenge { nonce: [0; NONCE_BYTES] }).len(), CHALLENGE_FRAME_BYTES);
        let answer = Frame::ChallengeAnswer { nonce: [0; NONCE_BYTES], proof: proof(0) };
        assert_eq!(encoded(&answer).len(), CHALLENGE_ANSWER_FRAME_BYTES);
        assert_eq!(encoded(&Frame::Proof(proof(0))).len(), PROOF_FRAME_BYTES);
    }

    #[test]
    fn a_challenge_needs_the_magic_and_this_version() {
        let challenge = encoded(&Frame::Challenge { nonce: [7; NONCE_BYTES] });
        let mut bytes = challenge.clone();
        bytes[PAYLOAD_AT] = b'X';
        assert_eq!(decode(&bytes), Err(WireError::BadMagic(*b"XLKP")));
        let mut bytes = challenge;
        bytes[PAYLOAD_AT + 4..PAYLOAD_AT + 8].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(decode(&bytes), Err(WireError::BadChallengeVersion(3)), "version 3 has no peer secret");
    }

    #[test]
    fn a_hello_is_laid_out_as_in_version_3_and_names_version_5() {
        // The Hello keeps its layout, so that a node of version 3 reads it
        // and refuses it for its version, naming it, rather than misreading
        // it; the version is 5 since grants carry their names.
        let hello = Hello {
            version: PROTOCOL_VERSION,
            nodes: 3,
            node: 1,
            incarnation: 0x0102_0304_0506_0708,
            epoch: 0x21,
            role: PeerRole::Standby,
            peers_fingerprint: 0x1112_1314_1516_1718,
        };
        let mut expected = vec![36, 0, 0, 0, 1, b'R', b'L', b'K', b'P', 5, 0, 0, 0, 3, 1];
        expected.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
        expected.extend_from_slice(&[0x21, 0, 0, 0, 0, 0, 0, 0]);
        expected.push(2);
        expected.extend_from_slice(&[0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]);
        assert_eq!(encoded(&Frame::Hello(hello)), expected);
        assert_eq!(decode(&expected), Ok(Some((Frame::Hello(hello), HELLO_FRAME_BYTES))));
    }

    #[test]
    fn a_challenge_names_the_secured_version_and_a_hello_of_it_is_refused() {
        let challenge = encoded(&Frame::Challenge { nonce: [7; NONCE_BYTES] });
        assert_eq!(challenge[PAYLOAD_AT + 4..PAYLOAD_AT + 8], SECURED_PROTOCOL_VERSION.to_le_bytes());
        let mut hello = encoded(&Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            nodes: 2,
            node: 0,
            incarnation: 1,
            epoch: 1,
            role: PeerRole::Active,
            peers_fingerprint: 1,
        }));
        hello[PAYLOAD_AT + 4..PAYLOAD_AT + 8].copy_from_slice(&SECURED_PROTOCOL_VERSION.to_le_bytes());
        assert_eq!(decode(&hello), Err(WireError::BadVersion(SECURED_PROTOCOL_VERSION)));
        assert_eq!(
            WireError::BadChallengeVersion(4).to_string(),
            "peer's challenge names protocol version 4; this node's peer secret speaks 6"
        );
        // A node of the release before names: its Hello and its Challenge
        // are refused, and the error names both versions.
        hello[PAYLOAD_AT + 4..PAYLOAD_AT + 8].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(decode(&hello), Err(WireError::BadVersion(3)));
        assert_eq!(WireError::BadVersion(3).to_string(), "peer speaks protocol version 3; this node speaks 5");
        let mut challenge = challenge;
        challenge[PAYLOAD_AT + 4..PAYLOAD_AT + 8].copy_from_slice(&4u32.to_le_bytes());
        assert_eq!(decode(&challenge), Err(WireError::BadChallengeVersion(4)));
    }

    #[test]
    fn a_proof_names_a_node_never_none() {
        for bad in [NODES_MAX as u8, INDEX_NONE] {
            let mut bytes = encoded(&Frame::Proof(proof(0)));
            bytes[PAYLOAD_AT] = bad;
            assert_eq!(decode(&bytes), Err(WireError::BadIndex(bad)));
            let mut bytes = encoded(&Frame::ChallengeAnswer { nonce: [0; NONCE_BYTES], proof: proof(0) });
            bytes[PAYLOAD_AT + NONCE_BYTES] = bad;
            assert_eq!(decode(&bytes), Err(WireError::BadIndex(bad)));
        }
    }

    #[test]
    fn the_first_frames_of_the_two_handshakes_differ_in_length() {
        // A node without a peer secret tells a Challenge from a Hello by the
        // length prefix alone, and a node with one tells a Hello from a
        // Challenge the same way.
        assert_ne!(CHALLENGE_FRAME_BYTES, HELLO_FRAME_BYTES);
    }

    #[test]
    fn encoding_appends_without_touching_what_is_there() {
        let mut out = b"xyz".to_vec();
        encode(&hello(), &mut out);
        assert_eq!(&out[..3], b"xyz");
        assert_eq!(decode(&out[3..]), Ok(Some((hello(), out.len() - 3))));
    }

    #[test]
    fn full_frames_of_the_longest_keys_fit_and_round_trip() {
        let key = [b'k'; KEY_LEN_MAX];
        let entries = vec![entry(&key, 1, LEASE_MS_LIMIT); ENTRIES_PER_FRAME_MAX];
        let chunk = Frame::SnapshotChunk(entries);
        let bytes = encoded(&chunk);
        assert!(bytes.len() - LEN_PREFIX_BYTES <= FRAME_LEN_MAX);
        assert_eq!(decode(&bytes), Ok(Some((chunk, bytes.len()))));

        let deltas = deltas_frame(vec![grant(&key, LEASE_MS_LIMIT); ENTRIES_PER_FRAME_MAX]);
        let bytes = encoded(&deltas);
        assert!(bytes.len() - LEN_PREFIX_BYTES <= FRAME_LEN_MAX);
        assert_eq!(decode(&bytes), Ok(Some((deltas, bytes.len()))));
    }

    #[test]
    fn only_whole_frames_decode() {
        assert_eq!(decode(&[]), Ok(None));
        for frame in one_of_each() {
            let bytes = encoded(&frame);
            for len in 0..bytes.len() {
                assert_eq!(decode(&bytes[..len]), Ok(None), "{frame:?} cut at {len}");
            }
        }
    }

    #[test]
    fn decode_uses_one_frame_and_leaves_the_next() {
        let mut bytes = encoded(&hello());
        let first_len = bytes.len();
        encode(&Frame::Message(PeerMessage::SnapshotRequest), &mut bytes);
        assert_eq!(decode(&bytes), Ok(Some((hello(), first_len))));
        assert_eq!(decode(&bytes[first_len..]), Ok(Some((Frame::Message(PeerMessage::SnapshotRequest), 5))));
    }

    #[test]
    #[should_panic(expected = "deltas in one frame")]
    fn encoding_too_many_deltas_panics() {
        let deltas = vec![grant(b"k", 1); ENTRIES_PER_FRAME_MAX + 1];
        encode_deltas(0, 0, &deltas, &mut Vec::new());
    }

    #[test]
    #[should_panic(expected = "snapshot entries in one frame")]
    fn encoding_too_many_snapshot_entries_panics() {
        let entries = vec![entry(b"k", 1, 1); ENTRIES_PER_FRAME_MAX + 1];
        encode_snapshot_chunk(&entries, &mut Vec::new());
    }

    // -- One test per rule --------------------------------------------------

    #[test]
    fn frame_too_long_is_refused_from_the_prefix_alone() {
        let too_long = (FRAME_LEN_MAX as u32 + 1).to_le_bytes();
        assert_eq!(decode(&too_long), Err(WireError::FrameTooLong { len: FRAME_LEN_MAX + 1 }));
        assert_eq!(decode(&u32::MAX.to_le_bytes()), Err(WireError::FrameTooLong { len: u32::MAX as usize }));
        // The longest legal length waits for its bytes.
        assert_eq!(decode(&(FRAME_LEN_MAX as u32).to_le_bytes()), Ok(None));
    }

    #[test]
    fn unknown_frame_types_are_refused() {
        for type_byte in [0, 15, 0x80, 0xFF] {
            assert_eq!(decode(&raw_frame(type_byte, &[])), Err(WireError::UnknownType(type_byte)));
        }
    }

    #[test]
    fn an_empty_frame_is_truncated() {
        assert_eq!(decode(&0u32.to_le_bytes()), Err(WireError::Truncated));
    }

    #[test]
    fn a_payload_shorter_than_its_fields_is_truncated() {
        for frame in one_of_each() {
            let mut bytes = encoded(&frame);
            let len = bytes.len() - LEN_PREFIX_BYTES;
            bytes[..LEN_PREFIX_BYTES].copy_from_slice(&(len as u32 - 1).to_le_bytes());
            bytes.pop();
            assert_eq!(decode(&bytes), Err(WireError::Truncated), "{frame:?}");
        }
    }

    #[test]
    fn a_payload_longer_than_its_fields_is_refused() {
        for frame in one_of_each() {
            let mut bytes = encoded(&frame);
            let len = bytes.len() - LEN_PREFIX_BYTES;
            bytes[..LEN_PREFIX_BYTES].copy_from_slice(&(len as u32 + 1).to_le_bytes());
            bytes.push(0);
            assert_eq!(decode(&bytes), Err(WireError::TrailingBytes), "{frame:?}");
        }
    }

    #[test]
    fn hello_needs_the_magic_and_this_version() {
        let mut bytes = encoded(&hello());
        bytes[PAYLOAD_AT] = b'X';
        assert_eq!(decode(&bytes), Err(WireError::BadMagic(*b"XLKP")));

        let mut bytes = encoded(&hello());
        bytes[PAYLOAD_AT + 4..PAYLOAD_AT + 8].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(decode(&bytes), Err(WireError::BadVersion(1)), "version 1 sends snapshots whole");
    }

    #[test]
    fn hello_needs_a_cluster_size_and_an_index_in_range() {
        let nodes_at = PAYLOAD_AT + 8;
        for nodes in [0, NODES_MAX as u8 + 1, 0xFF] {
            let mut bytes = encoded(&hello());
            bytes[nodes_at] = nodes;
            assert_eq!(decode(&bytes), Err(WireError::BadNodes(nodes)));
        }
        // Node 2 of 3 as encoded; of 2 nodes it is out of range.
        let mut bytes = encoded(&hello());
        bytes[nodes_at] = 2;
        assert_eq!(decode(&bytes), Err(WireError::BadIndex(2)));
        // The largest cluster, last node.
        let mut bytes = encoded(&hello());
        bytes[nodes_at] = NODES_MAX as u8;
        bytes[nodes_at + 1] = NODES_MAX as u8 - 1;
        assert!(matches!(decode(&bytes), Ok(Some((Frame::Hello(Hello { nodes: 16, node: 15, .. }), _)))));
    }

    #[test]
    fn heartbeat_indexes_must_be_below_nodes_max_or_none() {
        let heartbeat_bytes = encoded(&Frame::Message(PeerMessage::Heartbeat(heartbeat())));
        for at in [PAYLOAD_AT + 33, PAYLOAD_AT + 52] {
            for index in [NODES_MAX as u8, 0x7F, 0xFE] {
                let mut bytes = heartbeat_bytes.clone();
                bytes[at] = index;
                assert_eq!(decode(&bytes), Err(WireError::BadIndex(index)), "byte {at}");
            }
        }
    }

    /// Every epoch field, by the byte it starts at in its frame.
    fn epoch_fields() -> Vec<(Frame, usize)> {
        vec![
            (hello(), PAYLOAD_AT + 18),
            (Frame::Message(PeerMessage::Heartbeat(heartbeat())), PAYLOAD_AT + 17),
            (Frame::Message(PeerMessage::Heartbeat(heartbeat())), PAYLOAD_AT + 25),
            (Frame::Message(PeerMessage::Heartbeat(heartbeat())), PAYLOAD_AT + 36),
            (Frame::Message(PeerMessage::HandOff { table: table(17, 5), epoch_seen: 50 }), PAYLOAD_AT),
            (Frame::Message(PeerMessage::HandOff { table: table(17, 5), epoch_seen: 50 }), PAYLOAD_AT + 16),
            (Frame::Message(PeerMessage::HandOffDone { table: table(17, 5), epoch: 66 }), PAYLOAD_AT),
            (Frame::Message(PeerMessage::HandOffDone { table: table(17, 5), epoch: 66 }), PAYLOAD_AT + 16),
            (Frame::Message(PeerMessage::HandOffRefused { table: table(17, 5) }), PAYLOAD_AT),
            (Frame::SnapshotBegin { table: table(17, 0) }, PAYLOAD_AT),
            (Frame::SnapshotEnd { table: table(17, 0) }, PAYLOAD_AT),
            (deltas_frame(vec![grant(b"k", 1)]), PAYLOAD_AT),
        ]
    }

    #[test]
    fn epochs_above_the_largest_a_token_can_carry_are_refused() {
        for (frame, at) in epoch_fields() {
            for epoch in [EPOCH_MAX + 1, 1 << 40, u64::MAX] {
                let mut bytes = encoded(&frame);
                bytes[at..at + 8].copy_from_slice(&epoch.to_le_bytes());
                assert_eq!(decode(&bytes), Err(WireError::BadEpoch(epoch)), "{frame:?} at byte {at}");
            }
            let mut bytes = encoded(&frame);
            bytes[at..at + 8].copy_from_slice(&EPOCH_MAX.to_le_bytes());
            assert!(decode(&bytes).is_ok(), "the largest epoch itself is fine: {frame:?} at byte {at}");
        }
    }

    #[test]
    fn refusal_reasons_must_be_known() {
        for reason in [0, 4, 0xFF] {
            let bytes = raw_frame(frame_type::HELLO_REFUSED, &[reason]);
            assert_eq!(decode(&bytes), Err(WireError::BadRefusal(reason)));
        }
    }

    #[test]
    fn the_peers_fingerprint_changes_with_the_order_and_the_client_addresses() {
        let address = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let (a, b) = (address(7700), address(7701));
        let ab = peers_fingerprint([&a, &b]);
        assert_eq!(ab, peers_fingerprint([&a, &b]), "the same list, the same fingerprint");
        assert_ne!(ab, peers_fingerprint([&b, &a]), "another order");
        assert_ne!(ab, peers_fingerprint([&a, &address(7702)]), "another address");
        assert_ne!(ab, peers_fingerprint([&a]), "fewer nodes");
        // The value is part of the protocol: nodes of any build must agree.
        assert_eq!(ab, fnv1a(b"127.0.0.1:7700,127.0.0.1:7701"));
    }

    /// FNV-1a 64 written out byte by byte, as the protocol defines it.
    fn fnv1a(bytes: &[u8]) -> u64 {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x100_0000_01b3);
        }
        hash
    }

    #[test]
    fn role_bytes_must_be_known() {
        for role in [0, 4, 0xFF] {
            let mut bytes = encoded(&hello());
            bytes[PAYLOAD_AT + 26] = role;
            assert_eq!(decode(&bytes), Err(WireError::BadRole(role)));

            let mut bytes = encoded(&Frame::Message(PeerMessage::Heartbeat(heartbeat())));
            bytes[PAYLOAD_AT + 16] = role;
            assert_eq!(decode(&bytes), Err(WireError::BadRole(role)));
        }
    }

    #[test]
    fn flags_must_be_zero_or_one() {
        for at in [PAYLOAD_AT + 34, PAYLOAD_AT + 35] {
            for flag in [2, 0xFF] {
                let mut bytes = encoded(&Frame::Message(PeerMessage::Heartbeat(heartbeat())));
                bytes[at] = flag;
                assert_eq!(decode(&bytes), Err(WireError::BadFlag(flag)), "byte {at}");
            }
        }
    }

    #[test]
    fn an_absent_table_must_be_zeros() {
        let mut bytes = encoded(&Frame::Message(PeerMessage::Heartbeat(heartbeat())));
        bytes[PAYLOAD_AT + 35] = 0;
        assert_eq!(decode(&bytes), Err(WireError::AbsentTableNotZero));
        // With zeros it is a heartbeat without a table.
        bytes[PAYLOAD_AT + 36..PAYLOAD_AT + 52].fill(0);
        let expected = Frame::Message(PeerMessage::Heartbeat(Heartbeat { table: None, ..heartbeat() }));
        assert_eq!(decode(&bytes), Ok(Some((expected, bytes.len()))));
    }

    #[test]
    fn keys_with_forbidden_bytes_are_refused() {
        for forbidden in [b' ', b'\t', b'\r', b'\n', 0] {
            let chunk = encoded(&Frame::SnapshotChunk(vec![entry(b"abc", 1, 1)]));
            let deltas = encoded(&deltas_frame(vec![grant(b"abc", 1)]));
            // Where the first key byte is: after the count (4) and the key length, and
            // for the delta after the stream, first version and kind too.
            for (mut bytes, key_at) in [(chunk, PAYLOAD_AT + 4 + 1), (deltas, PAYLOAD_AT + 20 + 1 + 1)] {
                bytes[key_at + 1] = forbidden;
                assert_eq!(decode(&bytes), Err(WireError::BadKey), "byte {forbidden}");
            }
        }
    }

    #[test]
    fn empty_and_too_long_keys_are_refused() {
        // An empty key: length 0, then the token and lease.
        let mut payload = 1u32.to_le_bytes().to_vec();
        payload.push(0);
        payload.extend_from_slice(&[0; 16]);
        assert_eq!(decode(&raw_frame(frame_type::SNAPSHOT_CHUNK, &payload)), Err(WireError::BadKey));

        // A key of 251 bytes, all of them there.
        let mut payload = 1u32.to_le_bytes().to_vec();
        payload.push(KEY_LEN_MAX as u8 + 1);
        payload.extend_from_slice(&[b'k'; KEY_LEN_MAX + 1]);
        payload.extend_from_slice(&[0; 16]);
        assert_eq!(decode(&raw_frame(frame_type::SNAPSHOT_CHUNK, &payload)), Err(WireError::BadKey));

        // The same in a delta.
        let mut payload = [1u64.to_le_bytes(), 0u64.to_le_bytes()].concat();
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&[delta_kind::RELEASE, 0]);
        payload.extend_from_slice(&[0; 8]);
        assert_eq!(decode(&raw_frame(frame_type::DELTAS, &payload)), Err(WireError::BadKey));
    }

    #[test]
    fn a_grants_name_travels_as_its_bytes_and_must_fit() {
        let alpha = name("wire-names-alpha");
        let named = Delta::Grant { key: Key::new(b"k"), token: 1, lease_ms: 1, name: alpha };
        let bytes = encoded(&deltas_frame(vec![named.clone()]));
        assert!(bytes.ends_with(b"\x10wire-names-alpha"), "{bytes:?}");
        assert_eq!(decode(&bytes), Ok(Some((deltas_frame(vec![named]), bytes.len()))));
        // A name of 251 bytes, all of them there, in a delta and in a chunk.
        let mut bytes = encoded(&deltas_frame(vec![grant(b"k", 1)]));
        *bytes.last_mut().unwrap() = NAME_LEN_MAX as u8 + 1;
        bytes.extend_from_slice(&[b'n'; NAME_LEN_MAX + 1]);
        let len = (bytes.len() - LEN_PREFIX_BYTES) as u32;
        bytes[..LEN_PREFIX_BYTES].copy_from_slice(&len.to_le_bytes());
        assert_eq!(decode(&bytes), Err(WireError::BadName));
        let mut bytes = encoded(&Frame::SnapshotChunk(vec![entry(b"k", 1, 0)]));
        *bytes.last_mut().unwrap() = 3;
        bytes.extend_from_slice(b"ab");
        let len = (bytes.len() - LEN_PREFIX_BYTES) as u32;
        bytes[..LEN_PREFIX_BYTES].copy_from_slice(&len.to_le_bytes());
        assert_eq!(decode(&bytes), Err(WireError::Truncated), "a name cut short");
    }

    #[test]
    fn delta_leases_must_be_between_one_ms_and_the_limit() {
        for lease_ms in [0, LEASE_MS_LIMIT + 1, u64::MAX] {
            for kind in [delta_kind::GRANT, delta_kind::EXTEND] {
                let mut bytes = encoded(&deltas_frame(vec![grant(b"k", 1)]));
                bytes[PAYLOAD_AT + 20] = kind;
                // The lease, then the grant's empty name.
                let lease_at = bytes.len() - 9;
                bytes[lease_at..lease_at + 8].copy_from_slice(&lease_ms.to_le_bytes());
                assert_eq!(decode(&bytes), Err(WireError::BadLease(lease_ms)), "kind {kind}");
            }
        }
    }

    #[test]
    fn snapshot_leases_must_not_exceed_the_limit() {
        let mut bytes = encoded(&Frame::SnapshotChunk(vec![entry(b"k", 1, 0)]));
        let lease_at = bytes.len() - 9;
        bytes[lease_at..lease_at + 8].copy_from_slice(&(LEASE_MS_LIMIT + 1).to_le_bytes());
        assert_eq!(decode(&bytes), Err(WireError::BadLease(LEASE_MS_LIMIT + 1)));
    }

    #[test]
    fn delta_kinds_must_be_known() {
        for kind in [0, 5, 0xFF] {
            let mut bytes = encoded(&deltas_frame(vec![grant(b"k", 1)]));
            bytes[PAYLOAD_AT + 20] = kind;
            assert_eq!(decode(&bytes), Err(WireError::BadDeltaKind(kind)));
        }
    }

    #[test]
    fn counts_above_the_limit_are_refused() {
        let count = ENTRIES_PER_FRAME_MAX as u32 + 1;
        let mut bytes = encoded(&Frame::SnapshotChunk(Vec::new()));
        bytes[PAYLOAD_AT..].copy_from_slice(&count.to_le_bytes());
        assert_eq!(decode(&bytes), Err(WireError::TooManyEntries(count)));

        let mut bytes = encoded(&deltas_frame(Vec::new()));
        bytes[PAYLOAD_AT + 16..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&bytes), Err(WireError::TooManyEntries(u32::MAX)));
    }

    #[test]
    fn a_count_the_frame_cannot_hold_is_truncated() {
        let mut bytes = encoded(&Frame::SnapshotChunk(vec![entry(b"k", 1, 1)]));
        bytes[PAYLOAD_AT..PAYLOAD_AT + 4].copy_from_slice(&(ENTRIES_PER_FRAME_MAX as u32).to_le_bytes());
        assert_eq!(decode(&bytes), Err(WireError::Truncated));
        // Only as much as the bytes can hold is reserved up front.
        let reader = Reader { bytes: &[0; 2 * SNAPSHOT_ENTRY_BYTES_MIN + 1] };
        assert_eq!(reader.capacity_for(ENTRIES_PER_FRAME_MAX, SNAPSHOT_ENTRY_BYTES_MIN), 2);
        assert_eq!(reader.capacity_for(1, SNAPSHOT_ENTRY_BYTES_MIN), 1);
    }

    #[test]
    fn delta_versions_must_not_run_past_u64_max() {
        let frame = Frame::Deltas { stream: 1, first_version: u64::MAX - 1, deltas: vec![grant(b"k", 1)] };
        let bytes = encoded(&frame);
        assert_eq!(decode(&bytes), Ok(Some((frame, bytes.len()))));

        let mut bytes = encoded(&deltas_frame(vec![grant(b"k", 1)]));
        bytes[PAYLOAD_AT + 8..PAYLOAD_AT + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&bytes), Err(WireError::VersionOverflow));
    }

    #[test]
    fn errors_read_as_sentences_with_their_values() {
        assert_eq!(
            WireError::FrameTooLong { len: 5_000_000 }.to_string(),
            "frame of 5000000 bytes announced; the limit is 1048576"
        );
        assert_eq!(WireError::BadVersion(1).to_string(), "peer speaks protocol version 1; this node speaks 5");
        assert_eq!(
            WireError::BadMagic(*b"GET ").to_string(),
            "hello or challenge starts with [47, 45, 54, 20], not [52, 4c, 4b, 50]: not a ringlock peer"
        );
        assert_eq!(WireError::TooManyEntries(3000).to_string(), "3000 entries in one frame; the limit is 1024");
        assert_eq!(
            WireError::BadEpoch(u64::MAX).to_string(),
            "epoch 18446744073709551615 out of range (the largest is 16777215)"
        );
    }

    /// Writes one valid frame of each type, and all of them as one stream, to
    /// the seeds of the `peer_decoder` fuzz target. Run it when the layout
    /// changes: `cargo test -p ringlock --lib write_fuzz_seeds -- --ignored`.
    #[test]
    #[ignore = "writes fuzz/seeds/peer_decoder"]
    fn write_fuzz_seeds() {
        let names = [
            "hello",
            "heartbeat_active",
            "heartbeat_standby",
            "snapshot_request",
            "hand_off",
            "hand_off_done",
            "hand_off_refused",
            "snapshot_begin",
            "snapshot_chunk",
            "snapshot_chunk_empty",
            "snapshot_end",
            "deltas",
            "deltas_empty",
            "deltas_last_epoch",
            "hello_refused_nodes",
            "hello_refused_same_node",
            "hello_refused_peer_list",
            "challenge",
            "challenge_answer",
            "proof",
        ];
        let frames = one_of_each();
        assert_eq!(names.len(), frames.len());
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/peer_decoder");
        std::fs::create_dir_all(&dir).unwrap();
        let mut stream = Vec::new();
        for (name, frame) in names.iter().zip(&frames) {
            std::fs::write(dir.join(name), encoded(frame)).unwrap();
            encode(frame, &mut stream);
        }
        std::fs::write(dir.join("stream"), stream).unwrap();
    }

    // -- Properties ---------------------------------------------------------

    fn key_strategy() -> impl Strategy<Value = Key> {
        let len = prop_oneof![1..=KEY_INLINE_LEN_MAX_FOR_TESTS, 1..=KEY_LEN_MAX];
        len.prop_flat_map(|len| proptest::collection::vec(any::<u8>(), len)).prop_map(|mut bytes| {
            for byte in &mut bytes {
                if matches!(*byte, b' ' | b'\t' | b'\r' | b'\n' | 0) {
                    *byte = b'k';
                }
            }
            Key::new(&bytes)
        })
    }

    const KEY_INLINE_LEN_MAX_FOR_TESTS: usize = ringlock_shards::KEY_INLINE_LEN_MAX;

    fn u64_strategy() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0), Just(u64::MAX), 0..1000u64, any::<u64>()]
    }

    fn epoch_strategy() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0), Just(EPOCH_MAX), 0..1000u64, 0..=EPOCH_MAX]
    }

    fn lease_strategy() -> impl Strategy<Value = u64> {
        prop_oneof![Just(1), Just(LEASE_MS_LIMIT), 1..=LEASE_MS_LIMIT]
    }

    fn role_strategy() -> impl Strategy<Value = PeerRole> {
        prop_oneof![Just(PeerRole::Active), Just(PeerRole::Standby), Just(PeerRole::Leaving)]
    }

    fn table_strategy() -> impl Strategy<Value = TableVersion> {
        (epoch_strategy(), u64_strategy()).prop_map(|(stream, version)| TableVersion { stream, version })
    }

    fn index_strategy() -> impl Strategy<Value = Option<usize>> {
        proptest::option::of(0..NODES_MAX)
    }

    fn hello_strategy() -> impl Strategy<Value = Hello> {
        (1..=NODES_MAX).prop_flat_map(|nodes| (Just(nodes), 0..nodes)).prop_flat_map(|(nodes, node)| {
            (u64_strategy(), epoch_strategy(), role_strategy(), u64_strategy()).prop_map(
                move |(incarnation, epoch, role, peers_fingerprint)| Hello {
                    version: PROTOCOL_VERSION,
                    nodes,
                    node,
                    incarnation,
                    epoch,
                    role,
                    peers_fingerprint,
                },
            )
        })
    }

    fn heartbeat_strategy() -> impl Strategy<Value = Heartbeat> {
        (
            (u64_strategy(), u64_strategy(), role_strategy(), epoch_strategy(), epoch_strategy()),
            (index_strategy(), any::<bool>(), proptest::option::of(table_strategy()), index_strategy()),
        )
            .prop_map(
                |((incarnation, sequence, role, epoch, epoch_seen), (following, caught_up, table, handing_off_to))| {
                    Heartbeat {
                        incarnation,
                        sequence,
                        role,
                        epoch,
                        epoch_seen,
                        following,
                        caught_up,
                        table,
                        handing_off_to,
                    }
                },
            )
    }

    fn message_strategy() -> impl Strategy<Value = PeerMessage> {
        prop_oneof![
            heartbeat_strategy().prop_map(PeerMessage::Heartbeat),
            Just(PeerMessage::SnapshotRequest),
            (table_strategy(), epoch_strategy())
                .prop_map(|(table, epoch_seen)| PeerMessage::HandOff { table, epoch_seen }),
            (table_strategy(), epoch_strategy()).prop_map(|(table, epoch)| PeerMessage::HandOffDone { table, epoch }),
            table_strategy().prop_map(|table| PeerMessage::HandOffRefused { table }),
        ]
    }

    fn delta_strategy() -> impl Strategy<Value = Delta> {
        prop_oneof![
            (key_strategy(), u64_strategy(), lease_strategy(), name_strategy())
                .prop_map(|(key, token, lease_ms, name)| Delta::Grant { key, token, lease_ms, name }),
            (key_strategy(), u64_strategy()).prop_map(|(key, token)| Delta::Release { key, token }),
            (key_strategy(), u64_strategy(), lease_strategy()).prop_map(|(key, token, lease_ms)| Delta::Extend {
                key,
                token,
                lease_ms
            }),
            (key_strategy(), u64_strategy()).prop_map(|(key, token)| Delta::Expire { key, token }),
        ]
    }

    fn entry_strategy() -> impl Strategy<Value = SnapshotEntry> {
        (
            key_strategy(),
            u64_strategy(),
            prop_oneof![Just(0), Just(LEASE_MS_LIMIT), 0..=LEASE_MS_LIMIT],
            name_strategy(),
        )
            .prop_map(|(key, token, lease_left_ms, name)| SnapshotEntry { key, token, lease_left_ms, name })
    }

    /// No name, or one of a few numbered on this node (a number this node
    /// never gave would not survive the trip, by design).
    fn name_strategy() -> impl Strategy<Value = NameId> {
        prop_oneof![Just(NameId::NONE), (0..4u8).prop_map(|n| name(&format!("wire-name-{n}")))]
    }

    fn frame_strategy() -> impl Strategy<Value = Frame> {
        prop_oneof![
            hello_strategy().prop_map(Frame::Hello),
            message_strategy().prop_map(Frame::Message),
            table_strategy().prop_map(|table| Frame::SnapshotBegin { table }),
            proptest::collection::vec(entry_strategy(), 0..12).prop_map(Frame::SnapshotChunk),
            table_strategy().prop_map(|table| Frame::SnapshotEnd { table }),
            (epoch_strategy(), u64_strategy(), proptest::collection::vec(delta_strategy(), 0..12)).prop_map(
                |(stream, first_version, deltas)| {
                    // Keep the last delta's version within a u64, as the decoder requires.
                    let first_version = first_version.min(u64::MAX - deltas.len() as u64);
                    Frame::Deltas { stream, first_version, deltas }
                }
            ),
            prop_oneof![Just(Refusal::Nodes), Just(Refusal::SameNode), Just(Refusal::PeerList)]
                .prop_map(Frame::HelloRefused),
            any::<[u8; NONCE_BYTES]>().prop_map(|nonce| Frame::Challenge { nonce }),
            (any::<[u8; NONCE_BYTES]>(), proof_strategy())
                .prop_map(|(nonce, proof)| Frame::ChallengeAnswer { nonce, proof }),
            proof_strategy().prop_map(Frame::Proof),
        ]
    }

    fn proof_strategy() -> impl Strategy<Value = Proof> {
        (0..NODES_MAX, u64_strategy(), any::<[u8; MAC_BYTES]>()).prop_map(|(node, peers_fingerprint, mac)| Proof {
            node,
            peers_fingerprint,
            mac,
        })
    }

    /// Decodes `input` if it can; if it decodes, its bytes must be exactly
    /// the encoding of what it decoded to (every frame has one encoding).
    fn check_decode_is_canonical(input: &[u8]) -> Result<(), TestCaseError> {
        if let Ok(Some((frame, used))) = decode(input) {
            prop_assert!(used <= input.len());
            prop_assert_eq!(&encoded(&frame)[..], &input[..used]);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn any_frame_round_trips(frame in frame_strategy()) {
            let bytes = encoded(&frame);
            prop_assert!(bytes.len() - LEN_PREFIX_BYTES <= FRAME_LEN_MAX);
            prop_assert_eq!(decode(&bytes), Ok(Some((frame, bytes.len()))));
        }

        #[test]
        fn every_strict_prefix_is_incomplete(frame in frame_strategy()) {
            let bytes = encoded(&frame);
            for len in 0..bytes.len() {
                prop_assert_eq!(decode(&bytes[..len]), Ok(None));
            }
        }

        #[test]
        fn a_stream_split_anywhere_decodes_to_the_same_frames(
            frames in proptest::collection::vec(frame_strategy(), 1..6),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let mut stream = Vec::new();
            for frame in &frames {
                encode(frame, &mut stream);
            }
            let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(stream.len() + 1)).collect();
            cuts.push(stream.len());
            cuts.sort_unstable();

            // Receive the stream piece by piece, decoding what is whole after each.
            let mut received = Vec::new();
            let mut decoded = Vec::new();
            let mut sent = 0;
            for cut in cuts {
                received.extend_from_slice(&stream[sent..cut]);
                sent = cut;
                while let Some((frame, used)) = decode(&received)? {
                    decoded.push(frame);
                    received.drain(..used);
                }
            }
            prop_assert!(received.is_empty());
            prop_assert_eq!(decoded, frames);
        }

        #[test]
        fn random_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..600)) {
            check_decode_is_canonical(&input)?;
        }

        #[test]
        fn random_payloads_of_known_types_never_panic(
            type_byte in 1..=frame_type::PROOF,
            payload in proptest::collection::vec(
                prop_oneof![Just(0u8), Just(1u8), Just(2u8), Just(0xFFu8), any::<u8>()], 0..300),
        ) {
            check_decode_is_canonical(&raw_frame(type_byte, &payload))?;
        }

        #[test]
        fn corrupted_frames_never_panic(
            frame in frame_strategy(),
            corruptions in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = encoded(&frame);
            for (at, byte) in corruptions {
                let at = at.index(bytes.len());
                bytes[at] = byte;
            }
            check_decode_is_canonical(&bytes)?;
        }
    }
}
