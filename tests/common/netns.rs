//! Hosts in network namespaces behind a router namespace, for tests of
//! links that fail without a reset (a cut cable, a lost route), which
//! loopback cannot show. Host `i` is 10.78.`i+1`.2 on its own link to the
//! router (10.78.`i+1`.1), so a link or route cut at the router leaves both
//! ends' interfaces up and their packets silently lost.
//!
//! Everything is made by the test and deleted on drop; nothing reaches
//! outside the namespaces.

use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::process::Command;

/// How a host is cut off from the others.
#[derive(Clone, Copy, Debug)]
pub enum Cut {
    /// Its link's router end is set down (and up again to heal).
    Link,
    /// The router black-holes its address (and removes that route to heal).
    Route,
}

pub struct Network {
    router: String,
    hosts: Vec<String>,
    /// The router's end of each host's link.
    router_links: Vec<String>,
    addresses: Vec<Ipv4Addr>,
    host_links: Vec<String>,
}

impl Network {
    /// `count` hosts behind one router, or `None` (and why) where namespaces
    /// cannot be made. Only a run without root may skip: as root (this
    /// project's CI machines), failing to make them fails the test.
    pub fn create(count: usize) -> Option<Network> {
        match Network::try_create(count) {
            Ok(network) => Some(network),
            // SAFETY: geteuid has no preconditions.
            Err(why) if unsafe { libc::geteuid() } != 0 => {
                eprintln!("SKIPPED: this test needs network namespaces and veth links (root, iproute2): {why}");
                None
            }
            Err(why) => panic!("running as root, yet no network namespace could be made: {why}"),
        }
    }

    fn try_create(count: usize) -> Result<Network, String> {
        // Unique per network in this process too (a `cargo test` run has
        // its tests in threads of one process); links' names stay within
        // the kernel's 15 bytes.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let id = format!("{}{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        let mut network = Network {
            router: format!("ringlock-{id}-r"),
            hosts: Vec::new(),
            router_links: Vec::new(),
            addresses: Vec::new(),
            host_links: Vec::new(),
        };
        ip(&["netns", "add", &network.router])?;
        ip(&["-n", &network.router, "link", "set", "lo", "up"])?;
        run_in(&network.router, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        for index in 0..count {
            let host = format!("ringlock-{id}-{index}");
            ip(&["netns", "add", &host])?;
            network.hosts.push(host.clone());
            let (host_link, router_link) = (format!("rl{id}h{index}"), format!("rl{id}r{index}"));
            let subnet = index + 1;
            ip(&[
                "link",
                "add",
                &host_link,
                "netns",
                &host,
                "type",
                "veth",
                "peer",
                "name",
                &router_link,
                "netns",
                &network.router,
            ])?;
            ip(&["-n", &host, "addr", "add", &format!("10.78.{subnet}.2/24"), "dev", &host_link])?;
            ip(&["-n", &network.router, "addr", "add", &format!("10.78.{subnet}.1/24"), "dev", &router_link])?;
            ip(&["-n", &host, "link", "set", "lo", "up"])?;
            ip(&["-n", &host, "link", "set", &host_link, "up"])?;
            ip(&["-n", &network.router, "link", "set", &router_link, "up"])?;
            ip(&["-n", &host, "route", "add", "default", "via", &format!("10.78.{subnet}.1")])?;
            network.router_links.push(router_link);
            network.addresses.push(Ipv4Addr::new(10, 78, subnet as u8, 2));
            network.host_links.push(host_link);
        }
        Ok(network)
    }

    /// Host `index`'s address (10.78.`index+1`.2 unless moved).
    pub fn address(&self, index: usize) -> IpAddr {
        IpAddr::V4(self.addresses[index])
    }

    /// Runs `work` on a thread inside host `index`'s namespace: processes it
    /// starts and sockets it opens are that host's.
    pub fn on_host<T: Send + 'static>(&self, index: usize, work: impl FnOnce() -> T + Send + 'static) -> T {
        let namespace = self.hosts[index].clone();
        std::thread::spawn(move || {
            enter(&namespace);
            work()
        })
        .join()
        .unwrap()
    }

    /// One cluster node per host, each listening on port 7700 of its host's
    /// address, all given the same `--peers`, with fast timings
    /// (`--heartbeat-ms 50 --failover-ms 300`) and `extra` flags.
    pub fn start_nodes(&self, extra: &[&str]) -> (Vec<std::net::SocketAddr>, Vec<super::Server>) {
        let addresses: Vec<std::net::SocketAddr> =
            (0..self.hosts.len()).map(|index| std::net::SocketAddr::new(self.address(index), 7700)).collect();
        let peers = addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        let servers = (0..self.hosts.len())
            .map(|index| {
                let mut args = vec![
                    "--peers".to_string(),
                    peers.clone(),
                    "--node".to_string(),
                    index.to_string(),
                    "--listen".to_string(),
                    addresses[index].to_string(),
                    "--heartbeat-ms".to_string(),
                    "50".to_string(),
                    "--failover-ms".to_string(),
                    "300".to_string(),
                ];
                args.extend(extra.iter().map(ToString::to_string));
                self.on_host(index, move || super::Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>()))
            })
            .collect();
        (addresses, servers)
    }

    /// A connection from host `from` to `address`.
    pub fn connect(&self, from: usize, address: std::net::SocketAddr) -> TcpStream {
        self.on_host(from, move || TcpStream::connect(address).expect("connect inside the test network"))
    }

    /// Writes host `index`'s own `/etc/hosts`, which processes started with
    /// [`Network::command`] see (`ip netns exec` mounts it over
    /// `/etc/hosts`). Written in place, so that running processes see the
    /// change at their next lookup.
    pub fn write_hosts(&self, index: usize, contents: &str) {
        let directory = format!("/etc/netns/{}", self.hosts[index]);
        std::fs::create_dir_all(&directory).expect("make the namespace's /etc directory");
        std::fs::write(format!("{directory}/hosts"), contents).expect("write the namespace's hosts file");
    }

    /// `program` to be run on host `index`, with that host's `/etc/hosts`.
    pub fn command(&self, index: usize, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.hosts[index], program]);
        command
    }

    /// Moves host `index` to another address on its link (`10.78.<index+1>.last`).
    pub fn readdress(&mut self, index: usize, last: u8) -> IpAddr {
        let (host, subnet) = (&self.hosts[index], index + 1);
        let link = self.host_links[index].clone();
        let old = self.addresses[index];
        ip(&["-n", host, "addr", "del", &format!("{old}/24"), "dev", &link]).expect("remove the old address");
        let new = Ipv4Addr::new(10, 78, subnet as u8, last);
        ip(&["-n", host, "addr", "add", &format!("{new}/24"), "dev", &link]).expect("add the new address");
        ip(&["-n", host, "route", "replace", "default", "via", &format!("10.78.{subnet}.1")]).expect("route again");
        self.addresses[index] = new;
        IpAddr::V4(new)
    }

    /// Cuts host `index` off: its packets, and every packet to it, are lost
    /// at the router, with no reset and no error at either end.
    pub fn cut(&self, index: usize, how: Cut) {
        match how {
            Cut::Link => ip(&["-n", &self.router, "link", "set", &self.router_links[index], "down"]),
            Cut::Route => {
                ip(&["-n", &self.router, "route", "add", "blackhole", &format!("{}/32", self.address(index))])
            }
        }
        .expect("cut a host off");
    }

    /// Undoes [`Network::cut`].
    pub fn heal(&self, index: usize, how: Cut) {
        match how {
            Cut::Link => ip(&["-n", &self.router, "link", "set", &self.router_links[index], "up"]),
            Cut::Route => {
                ip(&["-n", &self.router, "route", "del", "blackhole", &format!("{}/32", self.address(index))])
            }
        }
        .expect("heal a host's link");
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in &self.hosts {
            let _ = ip(&["netns", "del", host]);
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{host}"));
        }
        let _ = ip(&["netns", "del", &self.router]);
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip").args(args).output().map_err(|error| format!("ip {args:?}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("ip {args:?}: {}", String::from_utf8_lossy(&output.stderr).trim()))
    }
}

fn run_in(namespace: &str, command: &[&str]) -> Result<(), String> {
    let mut args = vec!["netns", "exec", namespace];
    args.extend_from_slice(command);
    ip(&args)
}

/// Moves the calling thread into `namespace`.
fn enter(namespace: &str) {
    let file = std::fs::File::open(format!("/run/netns/{namespace}")).expect("open the network namespace");
    // SAFETY: joining a network namespace by a descriptor we hold; only the
    // calling thread moves.
    let result = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
    assert_eq!(result, 0, "setns: {}", std::io::Error::last_os_error());
}
