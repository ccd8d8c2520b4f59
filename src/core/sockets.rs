//! The socket side of a shard core: accepting, arming receives and sends on
//! the ring, pausing a connection that does not read, and the end of a
//! connection (reading no more, the shards' acknowledgements, closing).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use io_uring::types::Fd;
use io_uring::{cqueue, opcode};
use ringlock_proto::{ErrorCode, Reply, encode_reply};
use ringlock_shards::{ClientId, Shard};

use crate::core::client_id::{client_id, split_client_id};
use crate::core::connection::Connection;
use crate::core::mailbox::CoreMessage;
use crate::core::ring::{Kind, RECV_BUFFER_GROUP, send_entry, user_data};
use crate::core::state::CoreState;

/// Connections per core (slot numbers have 24 bits in a client id).
const CONNECTIONS_PER_CORE_MAX: usize = 1 << 24;
/// Pause before accepting again after the process ran out of descriptors.
const ACCEPT_RETRY_MS: u64 = 100;

impl CoreState {
    /// Arms a multishot accept on the listening socket every core shares.
    /// Which core's accept the kernel wakes is not spread evenly (one core
    /// may take every connection that arrives while the server is idle), so
    /// the core that accepts hands connections round the cores (see
    /// [`CoreState::accepted`]).
    pub(crate) fn arm_accept(&mut self) {
        if self.accept_armed || self.stopping {
            return;
        }
        let entry = opcode::AcceptMulti::new(Fd(self.listener)).flags(libc::SOCK_CLOEXEC).build().user_data(user_data(
            Kind::Accept,
            0,
            0,
        ));
        self.push(entry);
        self.accept_armed = true;
    }

    pub(crate) fn retry_accept(&mut self) {
        if let Some(at) = self.accept_retry_at_ms
            && self.now_ms >= at
        {
            self.accept_retry_at_ms = None;
            self.arm_accept();
        }
    }

    pub(crate) fn arm_wake(&mut self) {
        if self.wake_armed {
            return;
        }
        let entry = opcode::Read::new(Fd(self.eventfd), (&mut *self.wake_buffer as *mut u64).cast(), 8)
            .build()
            .user_data(user_data(Kind::Wake, 0, 0));
        self.push(entry);
        self.wake_armed = true;
    }

    pub(crate) fn accepted(&mut self, result: i32, flags: u32) {
        if !cqueue::more(flags) {
            self.accept_armed = false;
        }
        if result < 0 {
            if !self.stopping && !self.accept_armed {
                if matches!(-result, libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) {
                    tracing::warn!(core = self.core, "cannot accept: {}", io::Error::from_raw_os_error(-result));
                    self.accept_retry_at_ms = Some(self.now_ms + ACCEPT_RETRY_MS);
                } else {
                    self.arm_accept();
                }
            }
            return;
        }
        let fd = result;
        if !self.accept_armed && !self.stopping {
            self.arm_accept();
        }
        let admitted = self.shared.connections.fetch_add(1, Ordering::SeqCst) < self.shared.max_connections;
        if !admitted || self.stopping {
            self.shared.connections.fetch_sub(1, Ordering::SeqCst);
            let code = if self.stopping { ErrorCode::ShuttingDown } else { ErrorCode::TooManyConnections };
            self.count_refusal(code);
            refuse(fd, code);
            return;
        }
        // The per-address count is taken only when a limit is set; a peer
        // that already left has no address and is not counted (its socket
        // fails at once).
        let peer_ip = if self.shared.per_ip.limited() { peer_ip(fd) } else { None };
        if let Some(ip) = peer_ip
            && !self.shared.per_ip.admit(ip)
        {
            self.shared.connections.fetch_sub(1, Ordering::SeqCst);
            self.count_error(ErrorCode::TooManyConnections);
            self.refused_per_ip += 1;
            refuse(fd, ErrorCode::TooManyConnections);
            return;
        }
        ringlock_ring::set_nodelay(fd);
        // Connections go round the cores, whichever core accepted them.
        let target =
            if self.cores > 1 { self.shared.next_core.fetch_add(1, Ordering::Relaxed) % self.cores } else { self.core };
        if target == self.core {
            self.adopt(fd, peer_ip);
        } else {
            self.outgoing[target].push(CoreMessage::Adopt { fd, peer_ip });
        }
    }

    /// Serves a connection accepted and admitted (counted in the limits) by
    /// this core or another.
    pub(crate) fn adopt(&mut self, fd: RawFd, peer_ip: Option<std::net::IpAddr>) {
        let full = self.free_slots.is_empty() && self.connections.len() >= CONNECTIONS_PER_CORE_MAX;
        if full || self.stopping {
            self.shared.connections.fetch_sub(1, Ordering::SeqCst);
            if let Some(ip) = peer_ip {
                self.shared.per_ip.release(ip);
            }
            let code = if self.stopping { ErrorCode::ShuttingDown } else { ErrorCode::TooManyConnections };
            self.count_refusal(code);
            refuse(fd, code);
            return;
        }
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                let generation = self.connections[slot as usize].generation;
                self.connections[slot as usize] = Connection::new(fd, generation, peer_ip);
                slot
            }
            None => {
                self.connections.push(Connection::new(fd, 0, peer_ip));
                (self.connections.len() - 1) as u32
            }
        };
        self.open += 1;
        self.accepted += 1;
        self.arm_recv(slot);
    }

    /// Counts a connection refused with `code` (not by the per-address limit).
    fn count_refusal(&mut self, code: ErrorCode) {
        self.count_error(code);
        if code == ErrorCode::ShuttingDown {
            self.refused_shutting_down += 1;
        } else {
            self.refused_max_connections += 1;
        }
    }

    fn arm_recv(&mut self, slot: u32) {
        let connection = &mut self.connections[slot as usize];
        connection.recv_armed = true;
        let entry = opcode::RecvMulti::new(Fd(connection.fd), RECV_BUFFER_GROUP).build().user_data(user_data(
            Kind::Recv,
            slot,
            connection.generation,
        ));
        self.push(entry);
    }

    /// Re-arms a connection's receive if it ended (out of buffers, or paused)
    /// and the connection may read again.
    pub(crate) fn maybe_rearm_recv(&mut self, slot: u32) {
        let connection = &self.connections[slot as usize];
        if connection.recv_armed || connection.closing() || connection.fd < 0 || connection.input_ended() {
            return;
        }
        if !connection.reading() || connection.is_paused() {
            return;
        }
        self.arm_recv(slot);
    }

    /// A paused connection stops receiving, so its requests wait in the
    /// kernel's socket buffer (and the client's) rather than in ours.
    pub(crate) fn pause_if_full(&mut self, slot: u32) {
        let connection = &self.connections[slot as usize];
        if connection.is_paused() && connection.recv_armed {
            let entry = opcode::AsyncCancel::new(user_data(Kind::Recv, slot, connection.generation))
                .build()
                .user_data(user_data(Kind::Ignored, slot, 0));
            self.push(entry);
        }
    }

    /// Starts the sends of this turn and hands other cores their batches.
    pub(crate) fn flush(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        for &slot in &dirty {
            let connection = &mut self.connections[slot as usize];
            connection.dirty = false;
            let generation = connection.generation;
            let fd = connection.fd;
            if let Some((pointer, len)) = connection.start_send() {
                self.push(send_entry(fd, pointer, len, slot, generation));
            }
            self.pause_if_full(slot);
            self.maybe_finish(slot);
        }
        dirty.clear();
        self.dirty = dirty;
        for target in 0..self.cores {
            if target == self.core {
                continue;
            }
            let mut batch = std::mem::take(&mut self.refused[target]);
            if batch.is_empty() {
                batch = std::mem::take(&mut self.outgoing[target]);
            } else {
                batch.append(&mut self.outgoing[target]);
            }
            if batch.is_empty() {
                continue;
            }
            if let Err(batch) = self.shared.mailboxes[target].send(batch) {
                self.refused[target] = batch;
            }
        }
    }

    /// End of input: once the lines already received are handled, read no more.
    pub(crate) fn finish_input(&mut self, shard: &mut Shard, slot: u32) {
        let connection = &self.connections[slot as usize];
        // A paused connection still has whole lines to handle; the resume
        // after its replies drain comes back here.
        if connection.reading() && !connection.is_paused() {
            self.stop_reading(shard, slot);
        }
    }

    /// The connection reads no more requests: every shard drops its queued
    /// acquires and acknowledges, and the connection closes once the replies
    /// still owed are out.
    pub(crate) fn stop_reading(&mut self, shard: &mut Shard, slot: u32) {
        let connection = &mut self.connections[slot as usize];
        if !connection.stop_reading() {
            return;
        }
        let client = client_id(self.core, slot, connection.generation);
        connection.gone_acks = (self.cores - 1) as u32;
        let removed = shard.client_gone(self.now_ms, client);
        let connection = &mut self.connections[slot as usize];
        connection.in_flight = connection.in_flight.saturating_sub(removed);
        for target in (0..self.cores).filter(|&target| target != self.core) {
            self.outgoing[target].push(CoreMessage::ClientGone(client));
        }
    }

    /// A shard dropped `removed` requests of a connection that reads no more.
    pub(crate) fn gone_acknowledged(&mut self, client: ClientId, removed: u32) {
        let (_, slot, generation) = split_client_id(client);
        let Some(connection) = self.connection(slot, generation) else { return };
        connection.in_flight = connection.in_flight.saturating_sub(removed);
        connection.gone_acks = connection.gone_acks.saturating_sub(1);
        self.maybe_finish(slot);
    }

    /// The socket failed: nothing more can be sent, so close it now.
    pub(crate) fn kill(&mut self, shard: &mut Shard, slot: u32) {
        self.stop_reading(shard, slot);
        self.connections[slot as usize].output.clear();
        self.begin_close(slot);
    }

    /// Closes a connection that owes nothing more, and frees its slot once no
    /// I/O of it is in flight.
    pub(crate) fn maybe_finish(&mut self, slot: u32) {
        let connection = &self.connections[slot as usize];
        if connection.fd < 0 {
            return;
        }
        // While stopping, connections stay open until the core exits, so the
        // `shutting-down` answers still on their way reach them.
        if !connection.closing() && !self.stopping && connection.finished() {
            self.begin_close(slot);
        }
        let connection = &mut self.connections[slot as usize];
        if connection.closing() && !connection.recv_armed && !connection.send_in_flight {
            // SAFETY: closing a descriptor this connection owns, with no I/O on it.
            unsafe { libc::close(connection.fd) };
            connection.fd = -1;
            connection.generation = connection.generation.wrapping_add(1);
            connection.input = Vec::new();
            connection.output = Vec::new();
            connection.sending = Vec::new();
            self.free_slots.push(slot);
            self.shared.connections.fetch_sub(1, Ordering::SeqCst);
            if let Some(ip) = connection.peer_ip.take() {
                self.shared.per_ip.release(ip);
            }
        }
    }

    fn begin_close(&mut self, slot: u32) {
        let connection = &mut self.connections[slot as usize];
        if connection.fd < 0 || !connection.begin_close() {
            return;
        }
        self.open -= 1;
        // Shutting the socket down ends the multishot receive, so the
        // descriptor can be closed once its completions are in.
        // SAFETY: a socket this connection owns.
        unsafe { libc::shutdown(connection.fd, libc::SHUT_RDWR) };
    }

    /// The server is stopping: accept no more connections and read no more
    /// requests; what is queued is answered `shutting-down`.
    pub(crate) fn begin_stop(&mut self) {
        self.stopping = true;
        // SAFETY: shutting down the listening socket ends the accepts waiting
        // on it (every core's: they all stop now).
        unsafe { libc::shutdown(self.listener, libc::SHUT_RDWR) };
        for connection in &mut self.connections {
            connection.stop_for_shutdown();
        }
    }

    /// Closes every connection at exit, after its last replies: a FIN after
    /// the data, and unread input drained first so the kernel does not answer
    /// with a reset that could discard those replies.
    pub(crate) fn close_all(&mut self) {
        let mut scratch = [0u8; 4096];
        for connection in &mut self.connections {
            if connection.fd < 0 {
                continue;
            }
            // SAFETY: descriptors this loop owns; the ring is dropped next.
            unsafe {
                libc::shutdown(connection.fd, libc::SHUT_WR);
                for _ in 0..64 {
                    let read =
                        libc::recv(connection.fd, scratch.as_mut_ptr().cast(), scratch.len(), libc::MSG_DONTWAIT);
                    if read <= 0 {
                        break;
                    }
                }
                libc::close(connection.fd);
            }
            connection.fd = -1;
        }
        // SAFETY: our listening socket.
        unsafe { libc::close(self.listener) };
    }
}

/// The address of the client at the other end of `fd`, or `None` if it
/// already left.
fn peer_ip(fd: RawFd) -> Option<std::net::IpAddr> {
    // SAFETY: getpeername writes at most `len` bytes into the storage.
    let storage = unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getpeername(fd, (&mut storage as *mut libc::sockaddr_storage).cast(), &mut len) != 0 {
            return None;
        }
        storage
    };
    // A client that reaches an IPv6 listener over IPv4 counts as its IPv4
    // address, so both ways of reaching the server share one count.
    Some(crate::core::listener::socket_address_of(&storage).ip().to_canonical())
}

/// Answers a connection the server cannot take, and closes it.
fn refuse(fd: RawFd, code: ErrorCode) {
    let mut line = Vec::with_capacity(48);
    encode_reply(&Reply::Error { op: None, key: None, code }, &mut line);
    // SAFETY: a fresh socket we own; a short non-blocking send either fits in
    // its empty buffer or is dropped, and the socket is closed right after.
    unsafe {
        libc::send(fd, line.as_ptr().cast(), line.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        libc::close(fd);
    }
}
