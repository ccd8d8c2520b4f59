//! Socket options set on accepted connections.

use std::os::fd::RawFd;

/// Turns Nagle's algorithm off on an accepted TCP socket, so that a reply
/// goes out when it is sent. A failure is ignored: the socket still works,
/// only with Nagle's delay.
pub fn set_nodelay(fd: RawFd) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads `one` for the length given; `fd` is a socket
    // the caller owns, and a bad one only makes the call fail.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn an_accepted_socket_has_nagle_off() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(!accepted.nodelay().unwrap());
        set_nodelay(accepted.as_raw_fd());
        assert!(accepted.nodelay().unwrap());
    }
}
