//! TLS between the ring and the dispatcher: one rustls server connection
//! per socket, owned by the socket's core. Ciphertext from the ring goes in
//! and plaintext comes out for the dispatcher; the dispatcher's replies go
//! in and ciphertext comes out for the ring. Many pipelined replies taken
//! in one turn are written as one plaintext, so they share records.

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::{ServerConfig, ServerConnection};

/// Plaintext read from rustls at a time.
const PLAIN_CHUNK: usize = 16 << 10;

/// A socket's TLS state.
pub(crate) struct TlsLayer {
    connection: ServerConnection,
    /// Plaintext bytes taken from the dispatcher that are not yet known to
    /// be on the wire (encrypted and sent); reported sent once they are.
    pub(crate) plain_pending: usize,
    /// The client certificate's names were taken ([`TlsLayer::take_client_names`]).
    names_taken: bool,
}

impl TlsLayer {
    pub(crate) fn new(config: Arc<ServerConfig>) -> Result<TlsLayer, rustls::Error> {
        let mut connection = ServerConnection::new(config)?;
        // The dispatcher bounds the replies a connection may have unsent
        // (its output limit counts what this layer holds), so rustls keeps
        // whatever it is given rather than refusing part of a write.
        connection.set_buffer_limit(None);
        Ok(TlsLayer { connection, plain_pending: 0, names_taken: false })
    }

    /// Ciphertext from the socket: the plaintext it held is appended to
    /// `plain`. True once the client has sent its close_notify: it sends no
    /// more, which is an end of input. An error ends the connection (its
    /// alert, if any, is left to [`TlsLayer::write_tls`]).
    pub(crate) fn received(&mut self, mut data: &[u8], plain: &mut Vec<u8>) -> Result<bool, rustls::Error> {
        let mut closed = false;
        while !data.is_empty() {
            match self.connection.read_tls(&mut data) {
                // After the client's close_notify rustls takes no more
                // bytes: what follows it is dropped, not read again forever.
                Ok(0) => break,
                Ok(_) => {}
                // Only the plaintext buffer being full stops a read from a
                // slice; it is drained below, and the read tried again.
                Err(error) => debug_assert_eq!(error.kind(), std::io::ErrorKind::Other, "{error}"),
            }
            let state = self.connection.process_new_packets()?;
            closed |= state.peer_has_closed();
            self.read_plain(plain, state.plaintext_bytes_to_read());
        }
        Ok(closed)
    }

    /// Appends the `available` bytes of plaintext rustls holds to `plain`.
    /// Only that much is zeroed for the read: a request of a few dozen
    /// bytes does not cost clearing a whole record's worth of buffer.
    fn read_plain(&mut self, plain: &mut Vec<u8>, available: usize) {
        let mut wanted = available;
        while wanted > 0 {
            let start = plain.len();
            plain.resize(start + wanted.min(PLAIN_CHUNK), 0);
            match self.connection.reader().read(&mut plain[start..]) {
                Ok(read) => {
                    plain.truncate(start + read);
                    if read == 0 {
                        return;
                    }
                    wanted -= read.min(wanted);
                }
                Err(_) => {
                    // WouldBlock: no more plaintext for now.
                    plain.truncate(start);
                    return;
                }
            }
        }
    }

    /// Replies from the dispatcher, to be encrypted.
    pub(crate) fn write_plain(&mut self, plain: &[u8]) {
        // rustls buffers what it cannot send yet (during the handshake).
        let _ = self.connection.writer().write_all(plain);
        self.plain_pending += plain.len();
    }

    /// Whether the handshake is still going on.
    pub(crate) fn is_handshaking(&self) -> bool {
        self.connection.is_handshaking()
    }

    /// Once, when the handshake has ended: the names the client's
    /// certificate gives, if it presented one (mutual TLS), in its order:
    /// its DNS subject alternative names (wildcards left out: they name a
    /// set of hosts, not a client), then its URI ones (SPIFFE IDs, say).
    /// The certificate chained to `--tls-client-ca`, or the handshake would
    /// have failed. `None` before the end of the handshake and after the
    /// first call.
    pub(crate) fn take_client_names(&mut self) -> Option<Vec<String>> {
        if self.names_taken || self.connection.is_handshaking() {
            return None;
        }
        self.names_taken = true;
        let certificate = self.connection.peer_certificates()?.first()?;
        let parsed = webpki::EndEntityCert::try_from(certificate).ok()?;
        let dns = parsed.valid_dns_names().filter(|name| !name.starts_with('*'));
        Some(dns.chain(parsed.valid_uri_names()).map(str::to_string).collect())
    }

    /// Whether ciphertext (handshake messages, records, alerts) waits to be sent.
    pub(crate) fn wants_write(&self) -> bool {
        self.connection.wants_write()
    }

    /// Appends the ciphertext waiting to be sent to `out`.
    pub(crate) fn write_tls(&mut self, out: &mut Vec<u8>) {
        while self.connection.wants_write() {
            if self.connection.write_tls(out).is_err() {
                return;
            }
        }
    }

    /// A `close_notify` for a connection that closes, as ciphertext in `out`.
    pub(crate) fn close_notify(&mut self, out: &mut Vec<u8>) {
        self.connection.send_close_notify();
        self.write_tls(out);
    }

    /// Plaintext taken from the dispatcher that is now on the wire: every
    /// record rustls had is sent. Returns how many bytes that is.
    pub(crate) fn take_delivered(&mut self) -> usize {
        if self.connection.wants_write() || self.connection.is_handshaking() {
            return 0;
        }
        std::mem::take(&mut self.plain_pending)
    }
}
