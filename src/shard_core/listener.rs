//! The clients' listening socket, and the binding every listener of a node
//! shares (clients', peers', metrics'): retrying an address a server killed a
//! moment ago still holds, and the operator's message when it cannot listen.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::config::SocketOptions;

/// How long a start keeps trying an address that another socket holds. A
/// server killed a moment ago keeps its listener until the kernel has torn
/// down its io_uring rings, which takes milliseconds; a live server holds it
/// for good, and the start fails once this has passed.
const BIND_RETRY_FOR: Duration = Duration::from_secs(2);
/// Pause between two tries of a held address.
const BIND_RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Calls `bind` until it succeeds, fails otherwise than "address in use", or
/// [`BIND_RETRY_FOR`] has passed. `flag` names the flag that chose the address.
pub fn bind_retrying<T>(address: SocketAddr, flag: &str, mut bind: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let deadline = Instant::now() + BIND_RETRY_FOR;
    let mut warned = false;
    loop {
        match bind() {
            Err(error) if error.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                if !warned {
                    tracing::warn!(
                        %address,
                        "{address} ({flag}) is in use; trying again for up to {BIND_RETRY_FOR:?}, since a server \
                         killed a moment ago may still hold it"
                    );
                    warned = true;
                }
                std::thread::sleep(BIND_RETRY_PAUSE);
            }
            result => return result,
        }
    }
}

/// The operator's message for a socket that could not listen on `address`.
pub fn listen_error(what: &str, address: SocketAddr, flag: &str, error: &io::Error) -> String {
    if error.kind() == io::ErrorKind::AddrInUse {
        format!(
            "cannot listen {what}on {address}: address in use; pick another {flag} (another process listens \
             there, and ringlock never shares a port)"
        )
    } else {
        format!("cannot listen {what}on {address}: {error}; check {flag}")
    }
}

/// One listening socket for every shard core, and a duplicate descriptor of
/// it per core, on which that core arms its accept. io_uring hands each new
/// connection to one waiting accept only, and the core that accepted it
/// hands it on round the cores, so each connection lives on one core. The socket has no SO_REUSEPORT: a second server started on
/// the same address fails to bind, rather than splitting the clients with
/// this one and granting the same keys. Port 0 picks a free port, which the
/// log line and `P` then name.
pub fn bind_listeners(
    address: SocketAddr,
    count: usize,
    options: &SocketOptions,
) -> Result<(Vec<RawFd>, SocketAddr), String> {
    let fd = bind_retrying(address, "--listen", || listen_on(address))
        .map_err(|error| listen_error("", address, "--listen", &error))?;
    // Accepted sockets inherit these options from the listening socket, so
    // setting them here costs no system call per connection.
    set_options(fd, options).map_err(|error| {
        format!("cannot set TCP options on {address}: {error}; check --keepalive-*, --tcp-user-timeout-ms and --send-buffer-kib")
    })?;
    let local = local_address(fd).map_err(|error| format!("cannot read the listening address: {error}"))?;
    let mut listeners = vec![fd];
    for _ in 1..count {
        // SAFETY: duplicating a descriptor we own.
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(format!("cannot duplicate the listening socket: {}", io::Error::last_os_error()));
        }
        listeners.push(copy);
    }
    Ok((listeners, local))
}

/// Sets TCP keepalive and the user timeout on a socket, so that the
/// connections of a client host that vanished without a reset end, and their
/// queued acquires with them; and the send buffer, so that a client that
/// stops reading holds a bounded amount of kernel memory.
fn set_options(fd: RawFd, keepalive: &SocketOptions) -> io::Result<()> {
    let mut options = vec![(libc::SOL_SOCKET, libc::SO_KEEPALIVE, i32::from(keepalive.idle_s > 0))];
    if keepalive.idle_s > 0 {
        options.extend([
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, keepalive.idle_s as i32),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, keepalive.interval_s as i32),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, keepalive.probes as i32),
        ]);
    }
    options.push((libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, keepalive.user_timeout_ms as i32));
    if keepalive.send_buffer_bytes > 0 {
        options.push((libc::SOL_SOCKET, libc::SO_SNDBUF, keepalive.send_buffer_bytes as i32));
    }
    for (level, option, value) in options {
        let value: libc::c_int = value;
        // SAFETY: setting an integer option on a socket we own.
        let result = unsafe {
            libc::setsockopt(
                fd,
                level,
                option,
                (&value as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if result != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn listen_on(address: SocketAddr) -> io::Result<RawFd> {
    let family = if address.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket calls on a descriptor we create; errors checked.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SO_REUSEADDR lets a restart bind while connections of the last run
        // are in TIME_WAIT; unlike SO_REUSEPORT, it never lets two listening
        // sockets share the address.
        ringlock_ring::set_flag(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR);
        let (storage, len) = socket_address(address);
        if libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) != 0 || libc::listen(fd, 4096) != 0 {
            let error = io::Error::last_os_error();
            libc::close(fd);
            return Err(error);
        }
        Ok(fd)
    }
}

fn socket_address(address: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: a zeroed sockaddr_storage is valid, and each arm writes the
    // sockaddr type that fits in it.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        match address {
            SocketAddr::V4(v4) => {
                let out = &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                out.sin_family = libc::AF_INET as libc::sa_family_t;
                out.sin_port = v4.port().to_be();
                out.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) };
                (storage, size_of::<libc::sockaddr_in>() as libc::socklen_t)
            }
            SocketAddr::V6(v6) => {
                let out = &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                out.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                out.sin6_port = v6.port().to_be();
                out.sin6_addr = libc::in6_addr { s6_addr: v6.ip().octets() };
                out.sin6_flowinfo = v6.flowinfo();
                out.sin6_scope_id = v6.scope_id();
                (storage, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
            }
        }
    }
}

fn local_address(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: getsockname writes at most `len` bytes into the storage.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getsockname(fd, (&mut storage as *mut libc::sockaddr_storage).cast(), &mut len) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(socket_address_of(&storage))
    }
}

/// The IPv4 or IPv6 address a socket call wrote into `storage`.
pub fn socket_address_of(storage: &libc::sockaddr_storage) -> SocketAddr {
    // SAFETY: the family field says which sockaddr type the storage holds.
    unsafe {
        match i32::from(storage.ss_family) {
            libc::AF_INET => {
                let v4 = &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
                SocketAddr::from((ip, u16::from_be(v4.sin_port)))
            }
            _ => {
                let v6 = &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
                SocketAddr::from((ip, u16::from_be(v6.sin6_port)))
            }
        }
    }
}
