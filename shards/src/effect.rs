//! What a shard asks its caller to do: replies to send, deltas to replicate,
//! token ranges to fetch.

use ringlock_proto::{ErrorCode, Op, Reply};

use crate::key::Key;

/// The connection a request came from. The server chooses the numbers; the
/// shard only copies them into replies and groups waiters by them, so that a
/// closed connection's waiters can leave their queues at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

/// The authenticated name a request came from, as a small number the
/// server chooses (one per distinct name, for the life of the process;
/// [`NameId::NONE`] without authentication). The shard records it with
/// each grant: a release or an extend from another name is refused like a
/// wrong token, and `I` shows the token only to the holder's name. Requests
/// that all carry [`NameId::NONE`] behave exactly as without names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameId(pub u16);

impl NameId {
    /// No name: a server without client authentication.
    pub const NONE: NameId = NameId(0);
}

/// A reply to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardReply {
    /// The key is granted with this token.
    Acquired {
        /// The key.
        key: Key,
        /// The fencing token of the grant.
        token: u64,
    },
    /// The wait ran out; nothing was granted.
    TimedOut {
        /// The key.
        key: Key,
    },
    /// The grant was released.
    Released {
        /// The key.
        key: Key,
    },
    /// The lease was extended.
    Extended {
        /// The key.
        key: Key,
        /// The token of the grant, unchanged.
        token: u64,
    },
    /// This node is not active (or stopped being active while an acquire
    /// was queued): the client should send the request to the active
    /// (`M <op> <key> <active>`).
    Moved {
        /// The request's operation.
        op: Op,
        /// The key.
        key: Key,
    },
    /// `I <key> <token|-> <lease-left-ms> <waiters>`: the key's state. Boxed
    /// because `I` is rare: every reply stays as small as a grant, which is
    /// what the hot path moves.
    Inspected {
        /// The key.
        key: Key,
        /// Its holder, lease and queue.
        state: Box<KeyState>,
    },
    /// The request failed and had no effect.
    Error {
        /// The request's operation.
        op: Op,
        /// The key.
        key: Key,
        /// Why.
        code: ErrorCode,
    },
}

impl ShardReply {
    /// The reply as the wire protocol writes it; `active` is the address a
    /// [`ShardReply::Moved`] names (`None`: no active is known).
    #[inline(always)]
    pub fn to_wire<'a>(&'a self, active: Option<&'a [u8]>) -> Reply<'a> {
        match self {
            ShardReply::Moved { op, key } => Reply::Moved { op: *op, key: key.as_bytes(), active },
            ShardReply::Acquired { key, token } => Reply::Acquired { key: key.as_bytes(), token: *token },
            ShardReply::TimedOut { key } => Reply::TimedOut { key: key.as_bytes() },
            ShardReply::Released { key } => Reply::Released { key: key.as_bytes() },
            ShardReply::Extended { key, token } => Reply::Extended { key: key.as_bytes(), token: *token },
            ShardReply::Inspected { key, state } => Reply::Inspected {
                key: key.as_bytes(),
                token: (state.token != 0).then_some(state.token),
                lease_left_ms: u64::from(state.lease_left_ms),
                waiters: u64::from(state.waiters),
            },
            ShardReply::Error { op, key, code } => {
                Reply::Error { op: Some(*op), key: Some(key.as_bytes()), code: *code }
            }
        }
    }

    /// The key the reply is about.
    pub fn key(&self) -> &Key {
        match self {
            ShardReply::Acquired { key, .. }
            | ShardReply::TimedOut { key }
            | ShardReply::Released { key }
            | ShardReply::Extended { key, .. }
            | ShardReply::Inspected { key, .. }
            | ShardReply::Moved { key, .. }
            | ShardReply::Error { key, .. } => key,
        }
    }
}

/// What `I` shows of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyState {
    /// The holder's token, 0 if the key is not held (tokens are never 0).
    pub token: u64,
    /// Milliseconds left of the holder's lease (0 if not held).
    pub lease_left_ms: u32,
    /// Requests queued on the key.
    pub waiters: u32,
}

/// A change of the lock table, for the standbys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    /// The key was granted with `token` and a lease of `lease_ms` from now.
    Grant {
        /// The key.
        key: Key,
        /// Its new token.
        token: u64,
        /// The lease, counted from the grant.
        lease_ms: u64,
        /// The name that took it.
        name: NameId,
    },
    /// The grant with `token` was released.
    Release {
        /// The key.
        key: Key,
        /// The released token.
        token: u64,
    },
    /// The grant with `token` now ends `lease_ms` from now.
    Extend {
        /// The key.
        key: Key,
        /// The extended token.
        token: u64,
        /// The new lease, counted from now.
        lease_ms: u64,
    },
    /// The grant with `token` ran out of lease and was taken back.
    Expire {
        /// The key.
        key: Key,
        /// The expired token.
        token: u64,
    },
}

/// One thing the shard's caller must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Send `reply` to `client`.
    Reply {
        /// Who asked.
        client: ClientId,
        /// What to answer.
        reply: ShardReply,
    },
    /// The shard is running low on tokens: fetch a [`crate::TokenRange`] and
    /// give it to [`crate::Shard::add_token_range`].
    NeedTokens,
}
