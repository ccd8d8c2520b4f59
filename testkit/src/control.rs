//! The control protocol of `ringlock-testkit`: one command per line, one
//! reply line each, `ok …` or `err <reason>` (`testkit/README.md` lists the
//! commands). Each control connection is served by its own thread, so a
//! wait on one does not hold the others.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{FakeStandby, Names, Proxy};

/// A proxy or a fake standby the kit runs.
#[derive(Clone)]
enum Item {
    Proxy(Arc<Proxy>),
    Fake(Arc<FakeStandby>),
}

/// Everything one kit runs, by id.
#[derive(Clone, Default)]
pub struct Kit {
    items: Arc<Mutex<HashMap<u32, Item>>>,
    next_id: Arc<AtomicU32>,
}

/// A command line's parts: the command, the text after it, and its fields.
struct Args<'a> {
    command: &'a str,
    rest: &'a str,
    fields: std::vec::IntoIter<&'a str>,
}

impl<'a> Args<'a> {
    /// The next field, or an error naming what the command needs there.
    fn next(&mut self, what: &str) -> Result<&'a str, String> {
        self.fields.next().ok_or_else(|| format!("{} needs {what}", self.command))
    }
}

/// A list's reply: how many, then each.
fn counted(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    format!("{} {}", items.len(), items.join(" ")).trim_end().to_string()
}

impl Kit {
    /// Serves control connections from `listener` for as long as it lasts.
    pub fn serve(&self, listener: &TcpListener) {
        for stream in listener.incoming().flatten() {
            let kit = self.clone();
            std::thread::spawn(move || kit.serve_connection(stream));
        }
    }

    fn serve_connection(&self, stream: TcpStream) {
        let Ok(mut writer) = stream.try_clone() else { return };
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            let reply = match self.execute(line.trim_end_matches('\r')) {
                Ok(fields) if fields.is_empty() => "ok\n".to_string(),
                Ok(fields) => format!("ok {fields}\n"),
                Err(reason) => format!("err {reason}\n"),
            };
            if writer.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    }

    /// Carries out one command line; the reply's fields after `ok`, or why not.
    pub fn execute(&self, line: &str) -> Result<String, String> {
        let (command, rest) = line.split_once(' ').unwrap_or((line, ""));
        let fields: Vec<&str> = rest.split(' ').filter(|field| !field.is_empty()).collect();
        let mut args = Args { command, rest, fields: fields.into_iter() };
        match command {
            "ping" => Ok(String::new()),
            "proxy" | "fake" | "fake-active" | "target" | "close" => self.manage(&mut args),
            "accepted" | "refused" | "attempts" | "redirected" | "open" | "blackholed" => self.observe(&mut args),
            "wait-attempts" | "wait-open" | "wait-accepted" | "wait-upstream" => self.wait(&mut args),
            "cut" | "refuse" | "stall" | "stall-replies" | "resume" | "delay" | "reorder" | "blackhole" => {
                self.fault(&mut args)
            }
            "" => Err("empty command".to_string()),
            other => Err(format!("unknown command {other:?}")),
        }
    }

    /// Starts, re-points and closes proxies and fakes.
    fn manage(&self, args: &mut Args) -> Result<String, String> {
        match args.command {
            "proxy" => {
                let target = address(args.next("a target address")?)?;
                let proxy = Proxy::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), target)
                    .map_err(|error| format!("cannot start a proxy: {error}"))?;
                let addr = proxy.addr;
                Ok(format!("{} {addr}", self.add(Item::Proxy(Arc::new(proxy)))))
            }
            "fake" => {
                let names = names(args.next("an active address or -")?)?;
                let fake = FakeStandby::try_start(names).map_err(|error| format!("cannot start a fake: {error}"))?;
                let addr = fake.addr;
                Ok(format!("{} {addr}", self.add(Item::Fake(Arc::new(fake)))))
            }
            "fake-active" => {
                let fake = self.fake(args.next("an id")?)?;
                fake.set_names(names(args.next("an active address or -")?)?);
                Ok(String::new())
            }
            "target" => {
                let proxy = self.proxy(args.next("an id")?)?;
                proxy.set_target(address(args.next("a target address")?)?);
                Ok(String::new())
            }
            _ => {
                let id = number(args.next("an id")?)? as u32;
                self.items.lock().unwrap().remove(&id).map(|_| String::new()).ok_or_else(|| format!("no item {id}"))
            }
        }
    }

    /// Counts and lists what a proxy or a fake has seen.
    fn observe(&self, args: &mut Args) -> Result<String, String> {
        let id = args.next("an id")?;
        match args.command {
            "accepted" => match self.item(id)? {
                Item::Proxy(proxy) => Ok(proxy.accepted().to_string()),
                Item::Fake(fake) => Ok(fake.accepted().to_string()),
            },
            "refused" => Ok(self.proxy(id)?.refused().to_string()),
            "attempts" => {
                let times = self.proxy(id)?.attempt_times();
                Ok(counted(times.iter().map(|time| format!("{:.3}", time.as_secs_f64() * 1000.0))))
            }
            "redirected" => Ok(self.fake(id)?.redirected().to_string()),
            "open" => Ok(counted(self.proxy(id)?.open_ids().iter().map(ToString::to_string))),
            _ => Ok(counted(self.proxy(id)?.blackholed_ids().iter().map(ToString::to_string))),
        }
    }

    /// Waits until a proxy has seen something, or fails after the kit's patience.
    fn wait(&self, args: &mut Args) -> Result<String, String> {
        let proxy = self.proxy(args.next("an id")?)?;
        if args.command == "wait-upstream" {
            let except: Vec<usize> = match args.next("connections to pass over, or -")? {
                "-" => Vec::new(),
                list => list.split(',').map(number).collect::<Result<_, _>>()?,
            };
            // The text is the rest of the line, spaces included.
            let text = args.rest.splitn(3, ' ').nth(2).filter(|text| !text.is_empty());
            let text = text.ok_or_else(|| "wait-upstream needs a text".to_string())?;
            return Ok(proxy.try_wait_upstream(text.as_bytes(), &except)?.to_string());
        }
        let count = number(args.next("a count")?)?;
        match args.command {
            "wait-attempts" => proxy.try_wait_until(&format!("{count} connection attempts"), |proxy| {
                proxy.attempt_times().len() >= count
            })?,
            "wait-open" => {
                proxy.try_wait_until(&format!("{count} open connections"), |proxy| proxy.open_count() == count)?
            }
            _ => proxy.try_wait_until(&format!("{count} accepted connections"), |proxy| proxy.accepted() >= count)?,
        }
        Ok(String::new())
    }

    /// Turns a proxy's faults on and off.
    fn fault(&self, args: &mut Args) -> Result<String, String> {
        let proxy = self.proxy(args.next("an id")?)?;
        match args.command {
            "cut" => match args.fields.next() {
                Some(connection) => proxy.cut(number(connection)?),
                None => proxy.cut_all(),
            },
            "refuse" => proxy.set_refusing(on_off(args.next("on or off")?)?),
            "stall" => proxy.stall(),
            "stall-replies" => proxy.stall_replies(),
            "resume" => proxy.resume(),
            "delay" => proxy.delay_replies(Duration::from_millis(number(args.next("milliseconds")?)? as u64)),
            "reorder" => proxy.set_reordering(on_off(args.next("on or off")?)?),
            _ => {
                let on = on_off(args.next("on or off")?)?;
                match (on, args.fields.next().map(number).transpose()?) {
                    (true, None) => proxy.blackhole(),
                    (true, Some(connection)) => proxy.blackhole_one(connection),
                    (false, None) => proxy.lift_blackhole(),
                    (false, Some(connection)) => proxy.lift_blackhole_one(connection),
                }
            }
        }
        Ok(String::new())
    }

    fn add(&self, item: Item) -> u32 {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        self.items.lock().unwrap().insert(id, item);
        id
    }

    /// The proxy or the fake of `id` (held outside the table's lock, so a
    /// long wait on it does not stop other commands).
    fn item(&self, id: &str) -> Result<Item, String> {
        let id = number(id)? as u32;
        self.items.lock().unwrap().get(&id).cloned().ok_or_else(|| format!("no item {id}"))
    }

    fn proxy(&self, id: &str) -> Result<Arc<Proxy>, String> {
        match self.item(id)? {
            Item::Proxy(proxy) => Ok(proxy),
            Item::Fake(_) => Err(format!("item {id} is not a proxy")),
        }
    }

    fn fake(&self, id: &str) -> Result<Arc<FakeStandby>, String> {
        match self.item(id)? {
            Item::Fake(fake) => Ok(fake),
            Item::Proxy(_) => Err(format!("item {id} is not a fake")),
        }
    }
}

fn address(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| format!("{text:?} is not an address such as 127.0.0.1:7700"))
}

fn names(text: &str) -> Result<Names, String> {
    if text == "-" { Ok(Names::NoActive) } else { address(text).map(Names::Active) }
}

fn number(text: &str) -> Result<usize, String> {
    text.parse().map_err(|_| format!("{text:?} is not a number"))
}

fn on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?} is neither on nor off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_answer_ok_with_their_fields_or_err_with_a_reason() {
        let kit = Kit::default();
        assert_eq!(kit.execute("ping"), Ok(String::new()));
        let target = TcpListener::bind("127.0.0.1:0").unwrap();
        let started = kit.execute(&format!("proxy {}", target.local_addr().unwrap())).unwrap();
        let (id, addr) = started.split_once(' ').unwrap();
        assert_eq!(id, "0");
        let _client = TcpStream::connect(addr).unwrap();
        assert_eq!(kit.execute("wait-accepted 0 1"), Ok(String::new()));
        assert_eq!(kit.execute("wait-attempts 0 1"), Ok(String::new()));
        let attempts = kit.execute("attempts 0").unwrap();
        let (count, time) = attempts.split_once(' ').unwrap();
        assert_eq!(count, "1");
        assert!(time.parse::<f64>().unwrap() >= 0.0, "{attempts}");
        assert_eq!(kit.execute("open 0"), Ok("1 0".to_string()));
        assert_eq!(kit.execute("cut 0"), Ok(String::new()));
        assert_eq!(kit.execute("wait-open 0 0"), Ok(String::new()));
        assert_eq!(kit.execute("open 0"), Ok("0".to_string()));
        assert!(kit.execute("redirected 0").unwrap_err().contains("not a fake"));
        assert!(kit.execute("fake nowhere").unwrap_err().contains("not an address"));
        assert!(kit.execute("refuse 0 maybe").unwrap_err().contains("neither on nor off"));
        assert!(kit.execute("stall 9").unwrap_err().contains("no item 9"));
        assert!(kit.execute("wait-upstream 0 -").unwrap_err().contains("needs a text"));
        assert!(kit.execute("launch").unwrap_err().contains("unknown command"));
        assert_eq!(kit.execute("close 0"), Ok(String::new()));
        assert!(kit.execute("close 0").is_err());
    }

    #[test]
    fn every_fault_and_count_command_answers_and_checks_its_item_kind() {
        let kit = Kit::default();
        let target = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = target.local_addr().unwrap();
        kit.execute(&format!("proxy {target}")).unwrap();
        for command in ["refuse 0 on", "refuse 0 off", "stall 0", "stall-replies 0", "resume 0", "delay 0 5"] {
            assert_eq!(kit.execute(command), Ok(String::new()), "{command}");
        }
        for command in ["reorder 0 on", "reorder 0 off", "blackhole 0 on", "blackhole 0 off", "blackhole 0 on 3"] {
            assert_eq!(kit.execute(command), Ok(String::new()), "{command}");
        }
        assert_eq!(kit.execute("blackhole 0 off 3"), Ok(String::new()));
        assert_eq!(kit.execute("blackholed 0"), Ok("0".to_string()));
        assert_eq!(kit.execute(&format!("target 0 {target}")), Ok(String::new()));
        assert_eq!(kit.execute("accepted 0"), Ok("0".to_string()));
        assert_eq!(kit.execute("refused 0"), Ok("0".to_string()));
        assert!(kit.execute("delay 0").unwrap_err().contains("delay needs milliseconds"));

        let started = kit.execute("fake -").unwrap();
        let (id, _) = started.split_once(' ').unwrap();
        assert_eq!(id, "1");
        assert_eq!(kit.execute(&format!("fake-active 1 {target}")), Ok(String::new()));
        assert_eq!(kit.execute("accepted 1"), Ok("0".to_string()));
        assert_eq!(kit.execute("redirected 1"), Ok("0".to_string()));
        assert!(kit.execute("cut 1").unwrap_err().contains("not a proxy"));
        assert!(kit.execute("fake-active 0 -").unwrap_err().contains("not a fake"));
    }
}
