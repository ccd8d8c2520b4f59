//! Socket options: the one set on accepted connections, and boolean
//! options in general.

use std::os::fd::RawFd;

/// Turns Nagle's algorithm off on an accepted TCP socket, so that a reply
/// goes out when it is sent. A failure is ignored: the socket still works,
/// only with Nagle's delay.
pub fn set_nodelay(fd: RawFd) {
    let _ = set_flag(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY);
}

/// Sets the boolean socket option `name` of `level` on `fd`; false if the
/// kernel refused it.
pub fn set_flag(fd: RawFd, level: libc::c_int, name: libc::c_int) -> bool {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads `one` for the length given; a bad `fd` only
    // makes the call fail.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
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
