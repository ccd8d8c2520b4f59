//! The socket side of a shard core: accepting, arming receives and sends on
//! the ring, carrying out the dispatcher's socket effects (stop receiving,
//! receive again, close), and closing every socket at exit.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use io_uring::types::Fd;
use io_uring::{cqueue, opcode};
use ringlock_proto::{ErrorCode, Op, Reply, encode_reply};

use crate::shard_core::dispatcher::{BUFFER_BYTES_KEPT, Dispatcher, SocketEffect};
use crate::shard_core::event_loop::EventLoop;
use crate::shard_core::mailbox::CoreMessage;
use crate::shard_core::ring::{Kind, RECV_BUFFER_GROUP, send_entry, user_data};
use crate::shard_core::state::{CoreState, Socket};
use crate::shard_core::tls::TlsLayer;

/// Pause before accepting again after the process ran out of descriptors.
const ACCEPT_RETRY_MS: u64 = 100;

impl CoreState {
    /// Arms a multishot accept on the listening socket every core shares.
    /// Which core's accept the kernel wakes is not spread evenly (one core
    /// may take every connection that arrives while the server is idle), so
    /// the core that accepts hands connections round the cores (see
    /// [`EventLoop::accepted`]).
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

    fn arm_recv(&mut self, slot: u32, generation: u32) {
        let socket = &mut self.sockets[slot as usize];
        socket.recv_armed = true;
        let entry = opcode::RecvMulti::new(Fd(socket.fd), RECV_BUFFER_GROUP).build().user_data(user_data(
            Kind::Recv,
            slot,
            generation,
        ));
        self.push(entry);
    }

    /// Counts a connection refused with `code` (not by the per-address limit).
    fn count_refusal(&mut self, code: ErrorCode) {
        self.count_refusal_error(code);
        if code == ErrorCode::ShuttingDown {
            self.refused_shutting_down += 1;
        } else {
            self.refused_max_connections += 1;
        }
    }

    /// Sends each other core its batch of this turn, after what its full
    /// inbox refused before.
    fn send_batches(&mut self, outgoing: &mut [Vec<CoreMessage>]) {
        for (target, out) in outgoing.iter_mut().enumerate() {
            if target == self.core {
                continue;
            }
            let mut batch = std::mem::take(&mut self.refused[target]);
            if batch.is_empty() {
                batch = std::mem::take(out);
            } else {
                batch.append(out);
            }
            if batch.is_empty() {
                continue;
            }
            if let Err(batch) = self.shared.mailboxes[target].send(batch) {
                self.refused[target] = batch;
            }
        }
    }

    /// The server is stopping: accept no more connections.
    pub(crate) fn stop_accepting(&mut self) {
        self.stopping = true;
        // SAFETY: shutting down the listening socket ends the accepts waiting
        // on it (every core's: they all stop now).
        unsafe { libc::shutdown(self.listener, libc::SHUT_RDWR) };
    }

    /// Closes every connection at exit, after its last replies: a FIN after
    /// the data, and unread input drained first so the kernel does not answer
    /// with a reset that could discard those replies.
    pub(crate) fn close_all(&mut self) {
        let mut scratch = [0u8; 4096];
        for socket in &mut self.sockets {
            if socket.fd < 0 {
                continue;
            }
            // SAFETY: descriptors this loop owns; the ring is dropped next.
            unsafe {
                libc::shutdown(socket.fd, libc::SHUT_WR);
                for _ in 0..64 {
                    let read = libc::recv(socket.fd, scratch.as_mut_ptr().cast(), scratch.len(), libc::MSG_DONTWAIT);
                    if read <= 0 {
                        break;
                    }
                }
                libc::close(socket.fd);
            }
            socket.fd = -1;
        }
        // SAFETY: our listening socket.
        unsafe { libc::close(self.listener) };
    }
}

impl EventLoop {
    pub(crate) fn accepted(&mut self, result: i32, flags: u32) {
        let state = &mut self.state;
        if !cqueue::more(flags) {
            state.accept_armed = false;
        }
        if result < 0 {
            if !state.stopping && !state.accept_armed {
                if matches!(-result, libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) {
                    tracing::warn!(core = state.core, "cannot accept: {}", io::Error::from_raw_os_error(-result));
                    state.accept_retry_at_ms = Some(state.now_ms + ACCEPT_RETRY_MS);
                } else {
                    state.arm_accept();
                }
            }
            return;
        }
        let fd = result;
        if !state.accept_armed && !state.stopping {
            state.arm_accept();
        }
        let admitted = state.shared.connections.fetch_add(1, Ordering::SeqCst) < state.shared.max_connections;
        if !admitted || state.stopping {
            state.shared.connections.fetch_sub(1, Ordering::SeqCst);
            let code = if state.stopping { ErrorCode::ShuttingDown } else { ErrorCode::TooManyConnections };
            state.count_refusal(code);
            refuse(fd, code);
            return;
        }
        // The address is needed for the per-address limit and for the
        // failed `U` lines of an auth file; a peer that already left has no
        // address and is not counted (its socket fails at once).
        let auth = state.shared.auth.is_some();
        let peer_ip = if state.shared.per_ip.limited() || auth { peer_ip(fd) } else { None };
        if let Some(ip) = peer_ip
            && auth
            && state.shared.auth_failures.slowed(ip, state.now_ms)
        {
            // A guesser slowed by its wrong secrets: refused before any TLS
            // or parsing, so that its flood costs what a flood of `P` does.
            state.shared.connections.fetch_sub(1, Ordering::SeqCst);
            state.shared.auth_failures.count_refusal();
            refuse_slowed(fd, state.shared.tls.is_some());
            return;
        }
        if let Some(ip) = peer_ip
            && state.shared.per_ip.limited()
            && !state.shared.per_ip.admit(ip)
        {
            state.shared.connections.fetch_sub(1, Ordering::SeqCst);
            state.count_refusal_error(ErrorCode::TooManyConnections);
            state.refused_per_ip += 1;
            refuse(fd, ErrorCode::TooManyConnections);
            return;
        }
        ringlock_ring::set_nodelay(fd);
        // Connections go round the cores, whichever core accepted them.
        let target = if state.cores > 1 {
            state.shared.next_core.fetch_add(1, Ordering::Relaxed) % state.cores
        } else {
            state.core
        };
        if target == state.core {
            self.adopt(fd, peer_ip);
        } else {
            self.dispatcher.outgoing()[target].push(CoreMessage::Adopt { fd, peer_ip });
        }
    }

    /// Serves a connection accepted and admitted (counted in the limits) by
    /// this core or another.
    pub(crate) fn adopt(&mut self, fd: RawFd, peer_ip: Option<std::net::IpAddr>) {
        let state = &mut self.state;
        let tls = match &state.shared.tls {
            None => None,
            Some(tls) => match TlsLayer::new(tls.current()) {
                Ok(layer) => Some(Box::new(layer)),
                Err(error) => {
                    tracing::warn!(core = state.core, "cannot start TLS on a connection: {error}");
                    None
                }
            },
        };
        let tls_failed = state.shared.tls.is_some() && tls.is_none();
        let opened = if tls_failed { None } else { self.dispatcher.open() };
        let Some((slot, generation)) = opened else {
            state.shared.connections.fetch_sub(1, Ordering::SeqCst);
            if let Some(ip) = peer_ip
                && state.shared.per_ip.limited()
            {
                state.shared.per_ip.release(ip);
            }
            let code = if state.stopping { ErrorCode::ShuttingDown } else { ErrorCode::TooManyConnections };
            state.count_refusal(code);
            refuse(fd, code);
            return;
        };
        let socket = Socket { fd, peer_ip, tls, ..Socket::closed() };
        match state.sockets.get_mut(slot as usize) {
            Some(free) => *free = socket,
            None => {
                debug_assert_eq!(state.sockets.len(), slot as usize, "the dispatcher's slots come in order");
                state.sockets.push(socket);
            }
        }
        state.accepted += 1;
        if state.shared.auth.is_some() {
            self.dispatcher.set_peer_ip(slot, peer_ip);
        }
        if state.shared.tls.is_some() || state.shared.auth.is_some() {
            state.greetings.push_back((state.now_ms + state.shared.handshake_ms, slot, generation));
        }
        state.arm_recv(slot, generation);
    }

    /// Closes the connections whose `--handshake-ms` is over and that have
    /// not finished their TLS handshake, or, with an auth file, not
    /// authenticated: a handshake is just closed (nothing can be said in
    /// TLS yet), an unauthenticated connection is answered
    /// `E - - auth-required` first.
    pub(crate) fn expire_greetings(&mut self) {
        let now_ms = self.state.now_ms;
        while let Some(&(at, slot, generation)) = self.state.greetings.front() {
            if at > now_ms {
                break;
            }
            self.state.greetings.pop_front();
            if !self.dispatcher.is_live(slot, generation) {
                continue;
            }
            let Some(socket) = self.state.socket(slot) else { continue };
            if socket.closing {
                continue;
            }
            if socket.tls.as_ref().is_some_and(|tls| tls.is_handshaking()) {
                if let Some(tls) = &self.state.shared.tls {
                    tls.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                self.dispatcher.failed(slot);
            } else if let Some(auth) = &self.state.shared.auth
                && self.dispatcher.close_unauthenticated(slot)
            {
                auth.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            self.apply_socket_effects();
            self.maybe_close(slot);
        }
    }

    /// Carries out the dispatcher's socket effects.
    pub(crate) fn apply_socket_effects(&mut self) {
        let mut effects = std::mem::take(&mut self.socket_effects);
        self.dispatcher.take_effects(&mut effects);
        for &effect in &effects {
            match effect {
                SocketEffect::StopReceiving(slot) => {
                    // The multishot receive is cancelled; its last completion
                    // says so, and the receive is armed again on resume.
                    if self.state.sockets[slot as usize].recv_armed {
                        let generation = self.dispatcher.generation(slot);
                        let entry = opcode::AsyncCancel::new(user_data(Kind::Recv, slot, generation))
                            .build()
                            .user_data(user_data(Kind::Ignored, slot, 0));
                        self.state.push(entry);
                    }
                }
                SocketEffect::Receive(slot) => self.maybe_rearm_recv(slot),
                SocketEffect::Close(slot) => {
                    let socket = &mut self.state.sockets[slot as usize];
                    socket.closing = true;
                    if let Some(tls) = &mut socket.tls
                        && !socket.send_in_flight
                    {
                        // Every reply is out (the dispatcher closes only
                        // then): end the TLS stream properly, best effort.
                        let mut alert = Vec::new();
                        tls.close_notify(&mut alert);
                        send_now(socket.fd, &alert);
                    }
                    // Shutting the socket down ends the multishot receive, so
                    // the descriptor can be closed once its completions are in.
                    // SAFETY: a socket this connection owns.
                    unsafe { libc::shutdown(socket.fd, libc::SHUT_RDWR) };
                    self.maybe_close(slot);
                }
            }
        }
        self.socket_effects = effects;
    }

    /// Re-arms a connection's receive if it ended (out of buffers, or the
    /// multishot stopped) while the dispatcher still reads it.
    pub(crate) fn maybe_rearm_recv(&mut self, slot: u32) {
        let socket = &self.state.sockets[slot as usize];
        if socket.fd < 0 || socket.recv_armed || socket.closing || !self.dispatcher.wants_input(slot) {
            return;
        }
        let generation = self.dispatcher.generation(slot);
        self.state.arm_recv(slot, generation);
    }

    /// Closes a socket the dispatcher closed once no I/O of it is in flight,
    /// and frees its slot.
    pub(crate) fn maybe_close(&mut self, slot: u32) {
        let socket = &mut self.state.sockets[slot as usize];
        if socket.fd < 0 || !socket.closing || socket.recv_armed || socket.send_in_flight {
            return;
        }
        // SAFETY: closing a descriptor this connection owns, with no I/O on it.
        unsafe { libc::close(socket.fd) };
        let peer_ip = socket.peer_ip.take();
        *socket = Socket::closed();
        self.dispatcher.closed(slot);
        self.state.shared.connections.fetch_sub(1, Ordering::SeqCst);
        if let Some(ip) = peer_ip
            && self.state.shared.per_ip.limited()
        {
            self.state.shared.per_ip.release(ip);
        }
    }

    /// Starts the sends of this turn and hands other cores their batches.
    pub(crate) fn flush(&mut self) {
        let mut flush = std::mem::take(&mut self.state.flush);
        self.dispatcher.take_flush(&mut flush);
        flush.append(&mut self.state.tls_flush);
        let mut plain = std::mem::take(&mut self.state.plain);
        for &slot in &flush {
            let socket = &mut self.state.sockets[slot as usize];
            if socket.fd < 0 || socket.closing || socket.send_in_flight {
                // A send in flight is followed by the next when it completes.
                continue;
            }
            let ready = match &mut socket.tls {
                None => self.dispatcher.take_output(slot, &mut socket.sending),
                Some(tls) => {
                    // Every reply of the turn goes in as one plaintext, so
                    // pipelined replies share records.
                    if self.dispatcher.take_output(slot, &mut plain) {
                        tls.write_plain(&plain);
                    }
                    socket.sending.clear();
                    tls.write_tls(&mut socket.sending);
                    !socket.sending.is_empty()
                }
            };
            if ready {
                let generation = self.dispatcher.generation(slot);
                start_send(&mut self.state, slot, generation);
            }
        }
        self.state.plain = plain;
        flush.clear();
        self.state.flush = flush;
        self.state.send_batches(self.dispatcher.outgoing());
    }

    /// A send completed: `result` bytes went out, or the socket failed.
    pub(crate) fn sent(&mut self, slot: u32, generation: u32, result: i32) {
        if !self.dispatcher.is_live(slot, generation) {
            return;
        }
        let Some(socket) = self.state.socket(slot) else { return };
        if result < 0 {
            socket.send_in_flight = false;
            self.dispatcher.failed(slot);
        } else {
            let bytes = result as usize;
            socket.sent += bytes;
            if socket.sent < socket.sending.len() {
                // The kernel took part of it: the rest goes out next.
                let plaintext = socket.tls.is_none();
                let rest = &socket.sending[socket.sent..];
                let len = rest.len().min(u32::MAX as usize) as u32;
                let entry = send_entry(socket.fd, rest.as_ptr(), len, slot, generation);
                self.state.push(entry);
                if plaintext {
                    self.dispatcher.sent(slot, bytes);
                }
            } else {
                socket.send_in_flight = false;
                socket.sending.clear();
                socket.sent = 0;
                if socket.sending.capacity() > BUFFER_BYTES_KEPT {
                    socket.sending = Vec::new();
                }
                match &mut socket.tls {
                    None => self.dispatcher.sent(slot, bytes),
                    Some(tls) if tls.wants_write() => {
                        tls.write_tls(&mut socket.sending);
                        start_send(&mut self.state, slot, generation);
                    }
                    Some(tls) => {
                        // Every record is out: the replies in them are sent.
                        let delivered = tls.take_delivered();
                        if delivered > 0 {
                            self.dispatcher.sent(slot, delivered);
                        }
                    }
                }
            }
        }
        self.supply_tokens();
        self.apply_socket_effects();
        self.maybe_close(slot);
    }

    /// A receive completed: bytes, end of input, or a failure.
    pub(crate) fn received(&mut self, slot: u32, generation: u32, result: i32, flags: u32) {
        let buffer = cqueue::buffer_select(flags);
        let live = self.dispatcher.is_live(slot, generation);
        let Some(socket) = self.state.socket(slot).filter(|_| live) else {
            if let Some(id) = buffer {
                self.buffers.push(id);
            }
            return;
        };
        if !cqueue::more(flags) {
            socket.recv_armed = false;
        }
        if let Some(id) = buffer {
            if result > 0 {
                let data = self.buffers.get(id, result as usize);
                if socket.tls.is_none() {
                    self.dispatcher.received(slot, data);
                } else {
                    tls_received(&mut self.state, &mut self.dispatcher, slot, data);
                }
            }
            self.buffers.push(id);
        }
        match result {
            // End of input: answer what was sent, then close.
            0 => self.dispatcher.input_ended(slot),
            error if error < 0 && error != -libc::ENOBUFS && error != -libc::ECANCELED => self.dispatcher.failed(slot),
            _ => {}
        }
        self.supply_tokens();
        self.apply_socket_effects();
        self.maybe_rearm_recv(slot);
        self.maybe_close(slot);
    }
}

/// Starts the send of what `slot`'s socket holds in its sending buffer.
fn start_send(state: &mut CoreState, slot: u32, generation: u32) {
    let socket = &mut state.sockets[slot as usize];
    socket.sent = 0;
    socket.send_in_flight = true;
    let (fd, pointer, len) = (socket.fd, socket.sending.as_ptr(), socket.sending.len());
    state.push(send_entry(fd, pointer, len.min(u32::MAX as usize) as u32, slot, generation));
}

/// Ciphertext received on a TLS socket: its plaintext goes to the
/// dispatcher, and ciphertext of the layer's own (handshake messages) is
/// sent at the end of the turn. A close_notify ends the input, as a FIN
/// does. A TLS error ends the connection, after a
/// best-effort send of the alert that says why.
fn tls_received(state: &mut CoreState, dispatcher: &mut Dispatcher, slot: u32, data: &[u8]) {
    let mut plain = std::mem::take(&mut state.plain);
    plain.clear();
    let socket = &mut state.sockets[slot as usize];
    let Some(tls) = &mut socket.tls else { return };
    let outcome = tls.received(data, &mut plain);
    let wants_write = tls.wants_write();
    if let Err(error) = outcome {
        tracing::debug!(core = state.core, slot, "TLS connection ended: {error}");
        let mut alert = Vec::new();
        tls.write_tls(&mut alert);
        if !socket.send_in_flight {
            send_now(socket.fd, &alert);
        }
        state.tls_errors += 1;
        dispatcher.failed(slot);
    } else {
        if state.shared.auth.is_some()
            && let Some(names) = tls.take_client_names()
        {
            // Before any request of the connection is read.
            dispatcher.authenticate_certificate(slot, &names);
        }
        if !plain.is_empty() {
            dispatcher.received(slot, &plain);
        }
        if outcome == Ok(true) {
            // close_notify: answer what was sent before it, then close.
            dispatcher.input_ended(slot);
        }
        if wants_write {
            state.tls_flush.push(slot);
        }
    }
    state.plain = plain;
}

/// A short send that does not wait, for an alert before a close: it fits in
/// the socket's buffer or is dropped.
fn send_now(fd: RawFd, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    // SAFETY: a socket this core owns; the kernel copies the bytes.
    unsafe {
        libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
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
    Some(crate::shard_core::listener::socket_address_of(&storage).ip().to_canonical())
}

/// Closes a connection from an address slowed by its wrong secrets. A plain
/// one is told `E U - auth-failed` first: clients send `U` first, so they
/// read it as the answer to theirs and report a refused secret, as they
/// would after the delay. A TLS one is just closed (no handshake is spent
/// on it).
fn refuse_slowed(fd: RawFd, tls: bool) {
    if tls {
        // SAFETY: a fresh socket we own, closed at once.
        unsafe { libc::close(fd) };
        return;
    }
    let mut line = Vec::with_capacity(24);
    encode_reply(&Reply::Error { op: Some(Op::Authenticate), key: None, code: ErrorCode::AuthFailed }, &mut line);
    // SAFETY: as in `refuse`: a short non-blocking send on a fresh socket we
    // own, closed right after.
    unsafe {
        libc::send(fd, line.as_ptr().cast(), line.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        libc::close(fd);
    }
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
